/*
 * _jcs_scan: one read-only walk that says whether orjson's sorted output of a
 * value is already RFC 8785 canonical, so `canonical.dumps` can skip its exact
 * encoder. Internal to pi_workflows.wire.canonical; not public API.
 *
 * orjson's output is canonical when the value holds only exact dict (str keys),
 * list, tuple, str, int within +-(2^53-1), bool and None, and no key holds a
 * character at or above U+D800 (where code-point order and UTF-16 order part).
 * Anything else (floats, subclasses, other types, deep nesting) answers False,
 * and the exact Python encoder formats the value or names what is wrong with it.
 * The walk never raises for a JSON-shaped value and never changes the value.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define MAX_DEPTH 255
#define MAX_SAFE_INTEGER 9007199254740991LL

static int key_is_plain(PyObject *key)
{
    if (!PyUnicode_CheckExact(key)) {
        return 0;
    }
    if (PyUnicode_READY(key) < 0) {
        PyErr_Clear();
        return 0;
    }
    int kind = PyUnicode_KIND(key);
    if (kind == PyUnicode_1BYTE_KIND) {
        return 1;
    }
    const void *data = PyUnicode_DATA(key);
    Py_ssize_t length = PyUnicode_GET_LENGTH(key);
    for (Py_ssize_t i = 0; i < length; i++) {
        if (PyUnicode_READ(kind, data, i) >= 0xD800) {
            return 0;
        }
    }
    return 1;
}

static int value_is_plain(PyObject *value, int depth)
{
    if (value == Py_None || value == Py_True || value == Py_False) {
        return 1;
    }
    if (PyUnicode_CheckExact(value)) {
        return 1;
    }
    if (PyLong_CheckExact(value)) {
        int overflow = 0;
        long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (overflow != 0) {
            return 0;
        }
        if (number == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        return number <= MAX_SAFE_INTEGER && number >= -MAX_SAFE_INTEGER;
    }
    if (depth >= MAX_DEPTH) {
        return 0;
    }
    if (PyDict_CheckExact(value)) {
        Py_ssize_t position = 0;
        PyObject *key;
        PyObject *item;
        while (PyDict_Next(value, &position, &key, &item)) {
            if (!key_is_plain(key) || !value_is_plain(item, depth + 1)) {
                return 0;
            }
        }
        return 1;
    }
    if (PyList_CheckExact(value)) {
        /* A list can change size while we walk only if another thread mutates it;
           re-reading the size each step keeps the walk in bounds regardless. */
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(value); i++) {
            if (!value_is_plain(PyList_GET_ITEM(value, i), depth + 1)) {
                return 0;
            }
        }
        return 1;
    }
    if (PyTuple_CheckExact(value)) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(value); i++) {
            if (!value_is_plain(PyTuple_GET_ITEM(value, i), depth + 1)) {
                return 0;
            }
        }
        return 1;
    }
    return 0;
}

static PyObject *orjson_output_is_canonical(PyObject *module, PyObject *value)
{
    (void)module;
    return PyBool_FromLong(value_is_plain(value, 0));
}

static PyMethodDef methods[] = {
    {"orjson_output_is_canonical", orjson_output_is_canonical, METH_O,
     "True if orjson.dumps(value, option=OPT_SORT_KEYS) is RFC 8785 canonical."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT, "_jcs_scan", "Internal canonical JSON pre-check.", -1, methods,
};

PyMODINIT_FUNC PyInit__jcs_scan(void)
{
    return PyModule_Create(&module_definition);
}
