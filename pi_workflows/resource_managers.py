"""The resource-manager authoring API: `from pi_workflows.resource_managers import ...`.

A manager file `NAME.resource_manager.py` assigns `resource_manager =
define_resource_manager(...)`; docs/authoring.md § Resource managers shows one. The
implementation lives in `pi_workflows.engine`; this module names what authors use.
"""

from pi_workflows.engine import (
    NOT_APPLIED,
    ChildRun,
    ChildRunCall,
    Condition,
    EffectRejectedError,
    EffectsService,
    ManagedEffect,
    ManagedEffectCall,
    ManagerEffectHost,
    ReconcileContext,
    ReconcileResult,
    ReconcileResultError,
    RequestKeyConflictError,
    Resource,
    ResourceManagerDefinition,
    ResourceManagerError,
    ResourceRunnerRequiredError,
    WorkflowsHost,
    WorkflowsService,
    condition_false,
    condition_true,
    condition_unknown,
    define_resource_manager,
)

__all__ = [
    "NOT_APPLIED",
    "ChildRun",
    "ChildRunCall",
    "Condition",
    "EffectRejectedError",
    "EffectsService",
    "ManagedEffect",
    "ManagedEffectCall",
    "ManagerEffectHost",
    "ReconcileContext",
    "ReconcileResult",
    "ReconcileResultError",
    "RequestKeyConflictError",
    "Resource",
    "ResourceManagerDefinition",
    "ResourceManagerError",
    "ResourceRunnerRequiredError",
    "WorkflowsHost",
    "WorkflowsService",
    "condition_false",
    "condition_true",
    "condition_unknown",
    "define_resource_manager",
]
