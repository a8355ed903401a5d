"""The server's pykka actors, one module each (workflow-server.md § Process model)."""

from pi_workflows.actors._base import Address, Done, Reply, wait_reply
from pi_workflows.actors._channel_adapter import (
    POLL_SECONDS_ENV,
    RETRY_BOUND_ENV,
    ChannelAdapterActor,
    ChannelRequest,
    ChannelsConfig,
    ScanChannels,
    StopAdapters,
)
from pi_workflows.actors._claim_renewer import ClaimRenewerActor, LeaseLost, ServerEpochTaken
from pi_workflows.actors._coordinator_epoch import (
    ClaimCoordinator,
    CoordinatorEpochActor,
    ReleaseConnection,
)
from pi_workflows.actors._database import DatabaseActor, Transact, WatchCommits
from pi_workflows.actors._deadlines import DeadlinesActor
from pi_workflows.actors._process_supervisor import ProcessSupervisorActor
from pi_workflows.actors._reader import (
    RUN_VIEW_CACHE_ENV,
    Read,
    ReaderActor,
    run_view_cache_enabled,
)
from pi_workflows.actors._resource_runners import (
    RECONCILE_DEADLINE_ENV,
    RESOURCE_RUNNER_MODULE,
    ResourceRunnersActor,
    ResourceRunnersConfig,
    StartReconciling,
    reconcile_deadline_from_env,
)
from pi_workflows.actors._retention import (
    VACUUM_MIN_BYTES,
    RequestSweep,
    RetentionActor,
    RetentionConfig,
    StopSweeps,
)
from pi_workflows.actors._runner_host import (
    RUNNER_MODULE,
    ConnectRetention,
    ConnectScheduler,
    Drain,
    HandBack,
    RunCommand,
    RunnerHostActor,
    RunnerHostConfig,
)
from pi_workflows.actors._scheduler import SchedulerActor, Wake
from pi_workflows.actors._state_backup import Backup, BackupsSettled, StateBackupActor
from pi_workflows.actors._state_prune import Prune, StatePruneActor
from pi_workflows.actors._subscriptions import (
    ConnectionClosed,
    ReserveSubscription,
    Subscribe,
    SubscriptionActor,
    Unsubscribe,
)
from pi_workflows.actors._ticker import Ticker
from pi_workflows.actors._validations import (
    VALIDATE_TIMEOUT_ENV,
    VALIDATOR_MODULE,
    ConnectionGone,
    ResumeValidations,
    Submit,
    ValidationsActor,
    ValidationsConfig,
    validate_timeout_from_env,
)

__all__ = [
    "POLL_SECONDS_ENV",
    "RECONCILE_DEADLINE_ENV",
    "RESOURCE_RUNNER_MODULE",
    "RETRY_BOUND_ENV",
    "RUNNER_MODULE",
    "RUN_VIEW_CACHE_ENV",
    "VACUUM_MIN_BYTES",
    "VALIDATE_TIMEOUT_ENV",
    "VALIDATOR_MODULE",
    "Address",
    "Backup",
    "BackupsSettled",
    "ChannelAdapterActor",
    "ChannelRequest",
    "ChannelsConfig",
    "ClaimCoordinator",
    "ClaimRenewerActor",
    "ConnectRetention",
    "ConnectScheduler",
    "ConnectionClosed",
    "ConnectionGone",
    "CoordinatorEpochActor",
    "DatabaseActor",
    "DeadlinesActor",
    "Done",
    "Drain",
    "HandBack",
    "LeaseLost",
    "ProcessSupervisorActor",
    "Prune",
    "Read",
    "ReaderActor",
    "ReleaseConnection",
    "Reply",
    "RequestSweep",
    "ReserveSubscription",
    "ResourceRunnersActor",
    "ResourceRunnersConfig",
    "ResumeValidations",
    "RetentionActor",
    "RetentionConfig",
    "RunCommand",
    "RunnerHostActor",
    "RunnerHostConfig",
    "ScanChannels",
    "SchedulerActor",
    "ServerEpochTaken",
    "StartReconciling",
    "StateBackupActor",
    "StatePruneActor",
    "StopAdapters",
    "StopSweeps",
    "Submit",
    "Subscribe",
    "SubscriptionActor",
    "Ticker",
    "Transact",
    "Unsubscribe",
    "ValidationsActor",
    "ValidationsConfig",
    "Wake",
    "WatchCommits",
    "reconcile_deadline_from_env",
    "run_view_cache_enabled",
    "validate_timeout_from_env",
    "wait_reply",
]
