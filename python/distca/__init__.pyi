# Type stubs of the distca package (it re-exports distca._distca; see _distca.pyi).
from ._distca import (
    Batch as Batch,
    Exchange as Exchange,
    ModelSpec as ModelSpec,
    Plan as Plan,
    Server as Server,
    attention_backward as attention_backward,
    attention_forward as attention_forward,
    hardware_presets as hardware_presets,
    load_batches as load_batches,
    max_memory as max_memory,
    model_presets as model_presets,
    plan as plan,
    set_max_memory as set_max_memory,
    simulate as simulate,
    workload as workload,
)

EXCHANGES: tuple[str, ...]
__version__: str
__all__: list[str]
