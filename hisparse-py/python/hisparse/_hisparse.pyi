from os import PathLike
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

class SlotEnv:
    step: int
    layer: int
    request: int
    device_buffer_size: int
    slot: int
    token: int
    score: float
    prefetched: bool
    next_use: int

class Trace:
    @staticmethod
    def read(path: Union[str, PathLike[str]], max_bytes: Optional[int] = None, scores: bool = True) -> Trace: ...
    def write(self, path: Union[str, PathLike[str]], overwrite: bool = False) -> None: ...
    @staticmethod
    def from_array(
        selected: npt.ArrayLike,
        *,
        seq_lens: Optional[npt.ArrayLike] = None,
        top_k: Optional[int] = None,
        row_bytes: int = 656,
        first_request: int = 0,
    ) -> Trace: ...
    @staticmethod
    def from_sglang(
        indexer_topk: Union[str, bytes],
        *,
        layers: int,
        top_k: int,
        prompt_tokens: int,
        request: int = 0,
        row_bytes: int = 656,
    ) -> Trace: ...
    @property
    def top_k(self) -> int: ...
    @property
    def layers(self) -> int: ...
    @property
    def row_bytes(self) -> int: ...
    @property
    def has_scores(self) -> bool: ...
    @property
    def requests(self) -> List[int]: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[Tuple[int, int, int, int, List[int]]]: ...
    def to_arrays(self) -> Dict[str, np.ndarray]: ...

def simulate(
    trace: Trace,
    policies: Optional[Sequence[Any]] = None,
    buffers: Optional[Sequence[int]] = None,
    prefetchers: Optional[Sequence[str]] = None,
    *,
    warmup_steps: Optional[int] = 0,
    seed: Optional[int] = 1,
    belady: bool = True,
) -> List[Dict[str, Any]]: ...
def builtin_policies() -> List[str]: ...
def builtin_prefetchers() -> List[str]: ...
