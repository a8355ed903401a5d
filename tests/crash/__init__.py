"""The crash matrix: every declared crash point, driven through real server processes."""
