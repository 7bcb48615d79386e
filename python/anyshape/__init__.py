"""anyshape: compile an ONNX model once, run it at any input shape.

The interface follows ONNX Runtime's ``InferenceSession``::

    import anyshape
    sess = anyshape.InferenceSession("bert.onnx", dims={"seq": (1, 512)}, threads=2)
    [i.name for i in sess.get_inputs()]          # ['input_ids', 'attention_mask', ...]
    outputs = sess.run(None, {"input_ids": ids, "attention_mask": mask})
    sess.save("bert.anyshape")                   # a compiled artifact
    sess2 = anyshape.InferenceSession("bert.anyshape")   # loads it: no compilation
    pool = anyshape.ThreadPool(2)                # sessions may share one pool of threads:
    a = anyshape.InferenceSession("bert.onnx", pool=pool)    # their calls take turns on it
    b = anyshape.InferenceSession("gpt2.onnx", pool=pool)    # (by default each has its own)

Compiling happens in the constructor (or nothing is compiled, for an artifact); ``run`` then takes any shape the model's
symbols allow, with no recompilation. Inputs must have the model's dtypes and
be C-contiguous numpy arrays, which the run reads in place (as in ONNX Runtime,
do not write to them while it runs); outputs are numpy arrays that own the
results (no copy). ``run`` releases the GIL, and one session may be used from
several threads at once.

Errors: ``InvalidArgument`` (a ``ValueError``) for what the caller passed (the
model file, a feed's name, dtype or shape, naming the input, the dim and the
rule it breaks); ``UnsupportedModel`` (an ``AnyshapeError``) for a model that
uses what anyshape does not support (an operator, named with its node and
opset); ``AnyshapeError`` for the rest.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from ._anyshape import AnyshapeError, InvalidArgument, Session as _Session, ThreadPool, UnsupportedModel

__all__ = ["InferenceSession", "NodeArg", "ThreadPool", "AnyshapeError", "InvalidArgument", "UnsupportedModel"]


class NodeArg(NamedTuple):
    """An input or output: its name, its shape (ints, and strings for symbolic
    dims such as ``"batch"`` or ``"seq+1"``) and its numpy dtype name."""

    name: str
    shape: List[Union[int, str]]
    type: str


class InferenceSession:
    """A model compiled for every shape its symbols allow.

    ``path``: an ONNX file, or a compiled artifact (from ``save`` or
    ``anyshape compile``), which loads without compiling. ``dims``: ranges of
    symbolic dims, ``{"seq": (1, 512)}`` (a narrower range can give faster
    code; shapes outside it are rejected; an artifact's are fixed).
    ``threads``: the threads that run the model (default: every core; for an
    artifact, those it was compiled with). ``interpret``: run on the reference
    interpreter instead of compiling (slow: the oracle that tests compare with).
    ``device``: ``"cpu"``, ``"cuda"`` (NVIDIA GPU 0, through the driver;
    contractions on the tensor cores in bf16 with f32 results; not yet timed on
    a GPU) or ``"gpu-emulator"`` (the GPU's kernels on this machine's threads:
    slow, for tests); a GPU session's ``save`` writes an artifact with code for
    Hopper and every other supported GPU (cubins where ptxas is found). ``precision``:
    what a CPU model's contractions multiply in, ``"f32"`` or ``"bf16"`` (weights
    stored as bf16, AVX-512 BF16 products summed in f32; the rest f32).
    ``int8``: what a quantized model's products of 8-bit values multiply in:
    ``"auto"`` (default: the u8s8 kernels, VNNI's ``vpdpbusd``, where the machine
    has VNNI; the i16s8 ones otherwise: AVX2's ``vpmaddwd`` on int8 weights kept
    as bytes), ``"u8s8"``, ``"i16s8"``, ``"i16"`` (16-bit weights) or ``"float"``
    (``precision``'s kernels); all exact.
    """

    def __init__(
        self,
        path: str,
        dims: Optional[Mapping[str, Tuple[int, int]]] = None,
        threads: Optional[int] = None,
        interpret: bool = False,
        pool: Optional[ThreadPool] = None,
        device: str = "cpu",
        precision: str = "f32",
        int8: str = "auto",
    ) -> None:
        self._session = _Session(
            str(path),
            dict(dims) if dims is not None else None,
            threads,
            interpret,
            pool,
            str(device),
            str(precision),
            str(int8),
        )
        self._inputs = [NodeArg(*i) for i in self._session.inputs()]
        self._outputs = [NodeArg(*o) for o in self._session.outputs()]

    def save(self, path: str) -> None:
        """Save the compiled model as an artifact at ``path``: one file with its
        machine code, plans and pre-packed weights, which
        ``InferenceSession(path)`` and ``anyshape-rt`` load without compiling
        (on a machine with the same CPU features)."""
        self._session.save(str(path))

    def get_inputs(self) -> List[NodeArg]:
        """The model's inputs, in order."""
        return list(self._inputs)

    def get_outputs(self) -> List[NodeArg]:
        """The model's outputs, in order."""
        return list(self._outputs)

    def run(
        self, output_names: Optional[Sequence[str]], input_feed: Mapping[str, np.ndarray]
    ) -> List[np.ndarray]:
        """Run the model on ``input_feed`` (every input by name); return the
        outputs named in ``output_names`` in that order (all of them when
        ``None``)."""
        if not isinstance(input_feed, Mapping):
            raise InvalidArgument(f"input_feed must be a mapping of input names to arrays, got {type(input_feed).__name__}")
        names = None if output_names is None else [str(n) for n in output_names]
        return self._session.run(names, dict(input_feed))

    def output_shapes(self, input_feed: Mapping[str, Any]) -> Dict[str, Tuple[List[int], str]]:
        """For a GPU session's ``run_device``: each output's shape and numpy
        dtype name for these device-tensor feeds (read for their shapes and
        dtypes only), so that the caller can allocate the outputs::

            shapes = sess.output_shapes(feeds)
            outs = {n: torch.empty(s, dtype=getattr(torch, t), device="cuda") for n, (s, t) in shapes.items()}
        """
        if not isinstance(input_feed, Mapping):
            raise InvalidArgument(f"input_feed must be a mapping of input names to tensors, got {type(input_feed).__name__}")
        return {n: (list(shape), dtype) for n, shape, dtype in self._session.output_shapes(dict(input_feed))}

    def device_memory(self) -> Dict[str, int]:
        """A GPU session's device memory, in bytes: ``weights`` (uploaded once:
        the contractions' weights in bf16 and other constants), ``calls`` (the
        calls' memory now: one block a concurrent caller, sized by the largest
        shape it ran) and ``peak`` (the most both have held at once). The
        session's own allocations: the driver's context and CUDA graphs' memory
        aside. Like ``torch.cuda.max_memory_allocated`` for comparing."""
        return dict(self._session.device_memory())

    def run_device(self, input_feed: Mapping[str, Any], output_feed: Mapping[str, Any]) -> None:
        """Run a GPU session on tensors in GPU memory, writing its outputs into
        tensors in GPU memory: no copy through the host. With ``device="cuda"``
        the tensors are any objects with ``__cuda_array_interface__`` (PyTorch's
        CUDA tensors, CuPy arrays, Numba's device arrays) on this session's GPU;
        with ``device="gpu-emulator"`` numpy arrays (the emulator's device
        memory is this process's). ``input_feed``: every input by name,
        C-contiguous, of the model's dtype. ``output_feed``: every output by
        name, C-contiguous, writable, of the shape and dtype ``output_shapes``
        gives, overlapping no other tensor given. The work queued on a
        tensor's stream (the interface's ``stream``) is waited for before the
        run; the outputs are complete when this returns. Do not use the outputs
        from other work while it runs. Errors (a wrong shape, a tensor in
        host memory or on another GPU) are raised before anything is written.
        """
        if not isinstance(input_feed, Mapping) or not isinstance(output_feed, Mapping):
            raise InvalidArgument("input_feed and output_feed must be mappings of names to tensors")
        self._session.run_device(dict(input_feed), dict(output_feed))
