"""The rule catalog: one rule per module. Installed as ``speedfix.rules``."""

from speedfix.rules.sf101_dataloader_no_workers import DataloaderNoWorkers
from speedfix.rules.sf102_dataloader_no_pin_memory import DataloaderNoPinMemory
from speedfix.rules.sf103_dataloader_no_persistent_workers import DataloaderNoPersistentWorkers
from speedfix.rules.sf104_blocking_transfer import BlockingTransfer
from speedfix.rules.sf201_tf32_disabled import Tf32Disabled
from speedfix.rules.sf202_no_mixed_precision import NoMixedPrecision
from speedfix.rules.sf203_deprecated_amp_api import DeprecatedAmpApi
from speedfix.rules.sf205_clip_before_unscale import ClipBeforeUnscale
from speedfix.rules.sf301_sync_in_loop import SyncInLoop
from speedfix.rules.sf302_synchronize_in_loop import SynchronizeInLoop
from speedfix.rules.sf303_empty_cache_in_loop import EmptyCacheInLoop
from speedfix.rules.sf304_gc_collect_in_loop import GcCollectInLoop
from speedfix.rules.sf401_optimizer_not_fused import OptimizerNotFused
from speedfix.rules.sf402_zero_grad_not_none import ZeroGradNotNone
from speedfix.rules.sf501_model_not_compiled import ModelNotCompiled
from speedfix.rules.sf502_compile_positional_mode import CompilePositionalMode
from speedfix.rules.sf601_cudnn_benchmark_off import CudnnBenchmarkOff
from speedfix.rules.sf602_deterministic_mode import DeterministicMode
from speedfix.rules.sf603_anomaly_detection_on import AnomalyDetectionOn
from speedfix.rules.sf701_create_then_move import CreateThenMove
from speedfix.rules.sf703_conv_bias_before_batchnorm import ConvBiasBeforeBatchnorm
from speedfix.rules.sf801_data_parallel import DataParallel
from speedfix.rules.sf803_ddp_find_unused_parameters import DdpFindUnusedParameters

RULES = [
    DataloaderNoWorkers,
    DataloaderNoPinMemory,
    DataloaderNoPersistentWorkers,
    BlockingTransfer,
    Tf32Disabled,
    NoMixedPrecision,
    DeprecatedAmpApi,
    ClipBeforeUnscale,
    SyncInLoop,
    SynchronizeInLoop,
    EmptyCacheInLoop,
    GcCollectInLoop,
    OptimizerNotFused,
    ZeroGradNotNone,
    ModelNotCompiled,
    CompilePositionalMode,
    CudnnBenchmarkOff,
    DeterministicMode,
    AnomalyDetectionOn,
    CreateThenMove,
    ConvBiasBeforeBatchnorm,
    DataParallel,
    DdpFindUnusedParameters,
]
