# Type stubs of the compiled module distca._distca (python/bind_*.cpp; docs/python.md).
from typing import Any, Optional, Sequence, Tuple

import numpy as np
import numpy.typing as npt

PieceTuple = Tuple[int, int, int, int]  # (doc, offset, len, doc_len)

class ModelSpec:
    name: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    def __init__(self, name: str, n_layers: int, hidden: int, n_heads: int, n_kv_heads: int,
                 head_dim: int, ffn: int, vocab: int) -> None: ...
    @staticmethod
    def preset(name: str) -> ModelSpec: ...

def set_max_memory(size: str | int | None) -> None: ...
def max_memory() -> int: ...
def model_presets() -> list[str]: ...
def hardware_presets() -> list[str]: ...

class Batch:
    def __init__(self, per_rank: Sequence[Sequence[PieceTuple]], tokens_per_rank: int) -> None: ...
    @staticmethod
    def from_lengths(lengths: Sequence[int], ranks: int, tokens_per_rank: int,
                     layout: str = "contiguous", max_doc_len: int = 0) -> Batch: ...
    @staticmethod
    def from_json(text: str) -> Batch: ...
    @staticmethod
    def load(path: str) -> Batch: ...
    @property
    def ranks(self) -> int: ...
    @property
    def tokens_per_rank(self) -> int: ...
    @property
    def num_documents(self) -> int: ...
    @property
    def per_rank(self) -> list[list[PieceTuple]]: ...
    def pieces(self) -> npt.NDArray[np.int64]: ...  # (pieces, 5): rank, doc, offset, len, doc_len
    def rank_tokens(self, rank: int) -> int: ...
    def to_json(self) -> str: ...
    @property
    def dist(self) -> Optional[str]: ...
    @property
    def layout(self) -> Optional[str]: ...
    @property
    def seed(self) -> Optional[int]: ...
    @property
    def batch_file(self) -> Optional[str]: ...
    def __eq__(self, other: object) -> bool: ...

def load_batches(path: str) -> list[Batch]: ...
def workload(dist: str = "prolong", ranks: int = 8, tokens_per_rank: int = 524288, seed: int = 42,
             layout: str = "contiguous", max_doc_len: int = 0, long_prob: float = 0.3,
             batch: int = 0) -> Batch: ...

class Exchange:
    @property
    def rank(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def row_bytes(self) -> int: ...
    @property
    def send_counts(self) -> npt.NDArray[np.int64]: ...  # (ranks,)
    @property
    def send_displs(self) -> npt.NDArray[np.int64]: ...  # (ranks,)
    @property
    def recv_counts(self) -> npt.NDArray[np.int64]: ...  # (ranks,)
    @property
    def recv_displs(self) -> npt.NDArray[np.int64]: ...  # (ranks,)
    @property
    def send_rows(self) -> npt.NDArray[np.int64]: ...  # (sum send_counts, 2): doc, position
    @property
    def recv_rows(self) -> npt.NDArray[np.int64]: ...  # (sum recv_counts, 2): doc, position
    @property
    def send_local(self) -> npt.NDArray[np.int64]: ...  # (sum send_counts,): token row or -1
    @property
    def recv_local(self) -> npt.NDArray[np.int64]: ...  # (sum recv_counts,): token row or -1

class Server:
    @property
    def rank(self) -> int: ...
    @property
    def num_tasks(self) -> int: ...
    @property
    def load(self) -> float: ...
    @property
    def cu_seqlens_q(self) -> npt.NDArray[np.int32]: ...  # (tasks + 1,)
    @property
    def cu_seqlens_k(self) -> npt.NDArray[np.int32]: ...  # (tasks + 1,)
    @property
    def tasks(self) -> npt.NDArray[np.int64]: ...  # (tasks, 6): doc, q_begin, q_end, home, q_offset, segments
    @property
    def q_source(self) -> npt.NDArray[np.int64]: ...  # (total_q,)
    @property
    def kv_source(self) -> npt.NDArray[np.int64]: ...  # (total_kv,)

class Plan:
    @property
    def summary(self) -> dict[str, Any]: ...
    @property
    def ranks(self) -> int: ...
    @property
    def num_tasks(self) -> int: ...
    @property
    def scheduler(self) -> str: ...
    @property
    def plan_seconds(self) -> float: ...
    @property
    def batch(self) -> Batch: ...
    def tokens(self, rank: int) -> int: ...
    def token_rows(self, rank: int) -> npt.NDArray[np.int64]: ...  # (tokens, 2): doc, position
    @property
    def row_bytes(self) -> dict[str, int]: ...  # q, kv, o, lse
    def exchange(self, rank: int, kind: str) -> Exchange: ...
    def server(self, rank: int) -> Server: ...
    def validate(self) -> None: ...
    def to_dict(self) -> dict[str, Any]: ...

def plan(batch: Batch, *, model: str | ModelSpec = "llama-8b", scheduler: str = "cad",
         tolerance: float = 0.05, align_rows: int = 1, wlb_mem_cap: float = 1.2,
         dtype: str = "bf16", cost_table: str = "") -> Plan: ...

def simulate(gpus: int, *, dist: str = "prolong", tokens_per_rank: int = 524288,
             layout: str = "contiguous", max_doc_len: int = 0, seed: int = 42,
             long_prob: float = 0.3, batches: Optional[Sequence[Batch]] = None,
             model: str = "llama-8b", hardware: str = "h200", gpus_per_node: int = 0, pp: int = 1,
             microbatches: int = 0, strategy: str = "cad", mfu: float = 0.5,
             attention_efficiency: float = 0.5, attention_tile: int = 128, cost_table: str = "",
             tolerance: float = 0.1, wlb_mem_cap: float = 1.2, dtype: str = "bf16",
             shard_optimizer: bool = True, checkpointing: bool = True, lm_head: bool = True,
             grad_sync: bool = True, cad_servers: str = "keep",
             inter_node_bw: Optional[float] = None, inter_node_latency: Optional[float] = None,
             memory_gb: Optional[float] = None) -> dict[str, Any]: ...

def attention_forward(q: npt.NDArray[np.float32], k: npt.NDArray[np.float32],
                      v: npt.NDArray[np.float32], cu_seqlens_q: npt.NDArray[np.int32],
                      cu_seqlens_k: npt.NDArray[np.int32], *, causal: bool = True,
                      softmax_scale: float = 0.0
                      ) -> Tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]: ...
def attention_backward(q: npt.NDArray[np.float32], k: npt.NDArray[np.float32],
                       v: npt.NDArray[np.float32], o: npt.NDArray[np.float32],
                       lse: npt.NDArray[np.float32], d_o: npt.NDArray[np.float32],
                       cu_seqlens_q: npt.NDArray[np.int32], cu_seqlens_k: npt.NDArray[np.int32],
                       *, causal: bool = True, softmax_scale: float = 0.0
                       ) -> Tuple[npt.NDArray[np.float32], npt.NDArray[np.float32],
                                  npt.NDArray[np.float32]]: ...

def _time_make_plan(batch: Batch, model: str | ModelSpec, scheduler: str, tolerance: float,
                    repeats: int) -> list[Tuple[float, float]]: ...
