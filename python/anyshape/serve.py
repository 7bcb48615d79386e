"""Serving an anyshape model on Ray Serve (``pip install .[serve]``).

``ModelDeployment`` loads an ONNX model or a compiled artifact in each replica
and batches concurrent requests dynamically (``@serve.batch``). Requests are
single examples (or a few) of any length the model takes; one batch runs as few
model calls as it can without padding a request past the longest sequence in its
batch, never to the model's maximum:

* requests whose shapes agree past the batch axis are stacked and run at once;
* when the model has an ``attention_mask`` input, requests of close lengths
  are padded to the longest of their call (mask zero on the padding) as long as
  the padding stays within ``max_padding`` (10%) of the tokens the call
  computes, and each output is cut back to its request's length along the dims
  named by the same symbol (``seq``); other models run one call per distinct
  shape.

It answers HTTP (``POST /`` with JSON ``{"inputs": {name: nested lists}}``,
reply ``{"outputs": {name: nested lists}}``; a malformed request gets a 400 with
the reason, and the replica keeps serving) and Ray handles
(``handle.infer.remote({name: np.ndarray})`` returns ``{name: np.ndarray}``).
Replicas, CPUs per replica and autoscaling come from Ray Serve's usual options
or config file, so one deployment scales across a Ray cluster; a replica runs
as many threads as it has CPUs (``ray_actor_options={"num_cpus": k}``) unless
``threads`` says otherwise. On a 2-core machine (BENCHMARKS.md, session 23) one
replica with both cores answers a lone client soonest, and a replica per core
with one thread each serves many clients best (7.1 against 5.3 requests/s at
16 clients, BERT-base): replicas × threads = cores, more replicas the more
concurrent clients::

    from ray import serve
    from anyshape.serve import ModelDeployment
    app = ModelDeployment.options(num_replicas=2, ray_actor_options={"num_cpus": 2}).bind(
        "bert.anyshape", threads=2, max_batch_size=16)
    handle = serve.run(app, route_prefix="/bert")

or, in a Serve config file, ``import_path: anyshape.serve:build`` with
``args: {model: bert.anyshape, threads: 2}``.

``backend="onnxruntime"`` serves the same model with ONNX Runtime instead (for
comparisons; it needs the ``onnxruntime`` package).

``GenerationDeployment`` serves a decoder exported with its KV cache (optimum's
``text-generation-with-past``): ``generate`` streams a request's new tokens as
they are made (greedy), through a handle with ``stream=True``::

    app = GenerationDeployment.options(ray_actor_options={"num_cpus": 2}).bind(
        "llama.onnx", threads=2, max_new_tokens=64)
    handle = serve.run(app, route_prefix="/llama")
    for token in handle.options(stream=True).generate.remote([1, 5, 9], 16):
        ...

Each request keeps its own cache (the first step's is empty); requests' steps
interleave on the replica's threads (``concurrent`` at once), each step one
model call: requests are not batched into one call (no continuous batching).
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse

import anyshape

__all__ = ["ModelDeployment", "GenerationDeployment", "build", "RequestError"]

_DTYPES = {
    "float32": np.float32,
    "float64": np.float64,
    "float16": np.float16,
    "int64": np.int64,
    "int32": np.int32,
    "int8": np.int8,
    "uint8": np.uint8,
    "bool": np.bool_,
    # ONNX Runtime's names.
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(bool)": np.bool_,
}


class RequestError(ValueError):
    """A request the model cannot take: the reason names the input and the rule."""


class _Io:
    """An input or output: its name, its dims (ints, or symbol names) and numpy dtype."""

    def __init__(self, name: str, shape: Sequence[Any], dtype: str) -> None:
        self.name = name
        self.shape = [d if isinstance(d, int) else str(d) for d in shape]
        self.dtype = _DTYPES.get(dtype)


def _replica_threads() -> Optional[int]:
    """The CPUs Ray gave this replica (``ray_actor_options={"num_cpus": k}``),
    outside Ray None."""
    try:
        import ray

        if not ray.is_initialized():
            return None
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
    except Exception:  # noqa: BLE001 (not in a Ray worker)
        return None
    return max(1, int(cpus)) if cpus else None


def _open(model: str, backend: str, dims: Optional[Mapping[str, Tuple[int, int]]], threads: Optional[int]):
    """The session and its inputs and outputs; without ``threads``, as many
    threads as the replica has CPUs (replicas × threads then match the cores
    Ray hands out, not every replica every core)."""
    if threads is None:
        threads = _replica_threads()
    if backend == "anyshape":
        sess = anyshape.InferenceSession(model, dims=dims, threads=threads)
        run = sess.run
    elif backend == "onnxruntime":
        import onnxruntime as ort

        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        run = sess.run
    else:
        raise ValueError(f"backend must be 'anyshape' or 'onnxruntime', not {backend!r}")
    ins = [_Io(i.name, i.shape, i.type) for i in sess.get_inputs()]
    outs = [_Io(o.name, o.shape, o.type) for o in sess.get_outputs()]
    return run, ins, outs


class _Batcher:
    """Runs a list of requests as few model calls as it can (see the module's doc)."""

    def __init__(self, run, inputs: List[_Io], outputs: List[_Io], max_padding: float = 0.1) -> None:
        self.run = run
        self.max_padding = max_padding
        self.inputs = inputs
        self.outputs = outputs
        self.names = [i.name for i in inputs]
        mask = [i for i in inputs if i.name == "attention_mask"]
        # The padded axis: the mask's last dim, when it is a symbol.
        self.pad_symbol = mask[0].shape[-1] if mask and isinstance(mask[0].shape[-1], str) else None

    def check(self, feeds: Any) -> Dict[str, np.ndarray]:
        """The request's arrays in the model's dtypes, with a batch axis; a
        `RequestError` naming what is wrong otherwise."""
        if not isinstance(feeds, Mapping):
            raise RequestError(f"inputs must be an object of input names to arrays, got {type(feeds).__name__}")
        extra = [k for k in feeds if k not in self.names]
        if extra:
            raise RequestError(f"{extra[0]!r} is not an input of the model (its inputs: {self.names})")
        out = {}
        batch = None
        for i in self.inputs:
            if i.name not in feeds:
                raise RequestError(f"input {i.name!r} is missing")
            try:
                raw = np.asarray(feeds[i.name])
                if raw.dtype.kind == "f" and np.dtype(i.dtype).kind in "iub":
                    raise RequestError(f"input {i.name!r}: floats given, the model takes {np.dtype(i.dtype).name}")
                a = raw.astype(i.dtype, casting="unsafe" if raw.dtype.kind in "iub" else "same_kind")
            except (TypeError, ValueError, OverflowError) as e:
                if isinstance(e, RequestError):
                    raise
                raise RequestError(f"input {i.name!r}: not an array of {np.dtype(i.dtype).name}: {e}") from None
            if a.dtype == object:
                raise RequestError(f"input {i.name!r}: not a rectangular array")
            if a.ndim != len(i.shape):
                raise RequestError(f"input {i.name!r}: rank {a.ndim}, the model takes rank {len(i.shape)}")
            for axis, (n, d) in enumerate(zip(a.shape, i.shape)):
                if isinstance(d, int) and n != d:
                    raise RequestError(f"input {i.name!r}: dim {axis} is {n}, the model takes {d}")
            if a.ndim == 0 or a.shape[0] == 0:
                raise RequestError(f"input {i.name!r}: an empty batch")
            if batch is not None and a.shape[0] != batch:
                raise RequestError(f"input {i.name!r}: batch {a.shape[0]}, other inputs have {batch}")
            batch = a.shape[0]
            out[i.name] = np.ascontiguousarray(a)
        return out

    def _padded_axes(self, io: _Io) -> List[int]:
        return [k for k, d in enumerate(io.shape) if k > 0 and d == self.pad_symbol]

    def _key(self, feeds: Dict[str, np.ndarray]) -> Tuple:
        """Requests with equal keys run in one call: their shapes past the batch
        axis, except along the padded symbol's axes."""
        key = []
        for i in self.inputs:
            shape = list(feeds[i.name].shape[1:])
            for k in self._padded_axes(i):
                shape[k - 1] = None
            key.append(tuple(shape))
        return tuple(key)

    def run_all(self, requests: List[Dict[str, np.ndarray]]) -> List[Any]:
        """Each request's outputs, or the exception its call raised."""
        results: List[Any] = [None] * len(requests)
        groups: Dict[Tuple, List[int]] = {}
        for r, feeds in enumerate(requests):
            key = self._key(feeds) if self.pad_symbol else tuple(feeds[n].shape[1:] for n in self.names)
            groups.setdefault(key, []).append(r)
        calls: List[List[int]] = []
        for members in groups.values():
            calls.extend(self._split(requests, members))
        for members in calls:
            try:
                self._run_group([requests[r] for r in members], members, results)
            except Exception as e:
                if len(members) == 1:
                    results[members[0]] = e
                    continue
                # One request may be at fault (a length past the model's range):
                # the others still get their answers.
                for r in members:
                    try:
                        self._run_group([requests[r]], [r], results)
                    except Exception as e1:
                        results[r] = e1
        return results  # type: ignore[return-value]

    def _length(self, feeds: Dict[str, np.ndarray]) -> Optional[int]:
        """The request's length along the padded symbol's axes, if it has one."""
        n = None
        for i in self.inputs:
            for k in self._padded_axes(i):
                n = feeds[i.name].shape[k]
        return n

    def _split(self, requests, members: List[int]) -> List[List[int]]:
        """`members` (requests of one key) as calls: by length, each call padding
        its requests to its longest only while the padding stays within
        `max_padding` of the tokens computed (on a CPU, padding costs its full
        compute, and a batch saves little once a call has a few rows)."""
        if self.pad_symbol is None or len(members) < 2:
            return [members]
        rows = lambda r: next(iter(requests[r].values())).shape[0]
        order = sorted(members, key=lambda r: self._length(requests[r]) or 0, reverse=True)
        calls, current, real = [], [], 0
        for r in order:
            n, b = self._length(requests[r]) or 0, rows(r)
            if current:
                longest = self._length(requests[current[0]]) or 0
                padded = longest * (sum(rows(q) for q in current) + b)
                if padded > (1 + self.max_padding) * (real + n * b):
                    calls.append(current)
                    current, real = [], 0
            current.append(r)
            real += n * b
        calls.append(current)
        return calls

    def _run_group(self, group, members, results) -> None:
        # The longest length along the padded axes (one symbol: the same length
        # in every input that has it).
        lengths = [self._length(feeds) for feeds in group]
        longest = max((n for n in lengths if n is not None), default=None)
        stacked = {}
        for i in self.inputs:
            parts = []
            for feeds in group:
                a = feeds[i.name]
                axes = self._padded_axes(i)
                if axes and longest is not None and a.shape[axes[0]] < longest:
                    pad = [(0, 0)] * a.ndim
                    for k in axes:
                        pad[k] = (0, longest - a.shape[k])
                    # Zeros: the mask's padding is masked out; ids of 0 are never attended to.
                    a = np.pad(a, pad)
                parts.append(a)
            stacked[i.name] = np.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
        outs = self.run(None, stacked)
        start = 0
        for feeds, r, n in zip(group, members, lengths):
            b = next(iter(feeds.values())).shape[0]
            answer = {}
            for o, value in zip(self.outputs, outs):
                v = value[start : start + b]
                for k in self._padded_axes(o):
                    if n is not None and k < v.ndim:
                        v = np.take(v, np.arange(n), axis=k)
                answer[o.name] = np.ascontiguousarray(v)
            results[r] = answer
            start += b


class _Generator:
    """Greedy generation with a decoder's KV cache. The model's inputs are
    ``input_ids``, optionally ``attention_mask`` and ``position_ids``, and its
    caches (names with ``past``, rank 4: ``[batch, heads, past, head_dim]``);
    its outputs the logits (``logits``, or the first) and the next caches
    (names with ``present``, in the caches' order)."""

    def __init__(self, run, inputs: List[_Io], outputs: List[_Io]) -> None:
        self.run = run
        names = [i.name for i in inputs]
        self.past = [i for i in inputs if "past" in i.name]
        self.present = [k for k, o in enumerate(outputs) if "present" in o.name]
        known = {"input_ids", "attention_mask", "position_ids"} | {i.name for i in self.past}
        other = [n for n in names if n not in known]
        if "input_ids" not in names or not self.past or len(self.past) != len(self.present) or other:
            raise ValueError(
                "not a decoder with a KV cache: its inputs must be input_ids, attention_mask, position_ids "
                f"and past caches, one present output per cache (inputs {names}, "
                f"outputs {[o.name for o in outputs]})"
            )
        for i in self.past:
            if len(i.shape) != 4 or not isinstance(i.shape[1], int) or not isinstance(i.shape[3], int):
                raise ValueError(f"cache {i.name!r} has dims {i.shape}, not [batch, heads, past, head_dim]")
        self.mask = "attention_mask" in names
        self.positions = "position_ids" in names
        self.logits = next((k for k, o in enumerate(outputs) if o.name == "logits"), 0)

    @staticmethod
    def check(prompt: Any) -> np.ndarray:
        """The prompt's token ids as ``[1, n]`` int64; a `RequestError` otherwise."""
        try:
            a = np.asarray(prompt)
        except (TypeError, ValueError) as e:
            raise RequestError(f"the prompt is not an array of token ids: {e}") from None
        if a.ndim == 2 and a.shape[0] == 1:
            a = a[0]
        if a.ndim != 1 or a.size == 0:
            raise RequestError(f"the prompt must be a non-empty list of token ids, got shape {a.shape}")
        if a.dtype.kind not in "iu":
            raise RequestError(f"the prompt must be token ids (integers), got {a.dtype}")
        return a.astype(np.int64)[None, :]

    def steps(self, prompt: np.ndarray, max_new_tokens: int, eos: Optional[int] = None):
        """The new tokens, one at a time: the prompt's step with an empty
        cache, then a step a token."""
        caches = [np.zeros((1, i.shape[1], 0, i.shape[3]), i.dtype) for i in self.past]
        ids, past = prompt, 0
        for _ in range(max_new_tokens):
            n = ids.shape[1]
            feeds = {"input_ids": ids}
            if self.mask:
                feeds["attention_mask"] = np.ones((1, past + n), np.int64)
            if self.positions:
                feeds["position_ids"] = np.arange(past, past + n, dtype=np.int64)[None, :]
            feeds.update((i.name, c) for i, c in zip(self.past, caches))
            out = self.run(None, feeds)
            token = int(np.argmax(out[self.logits][0, -1]))
            yield token
            if token == eos:
                return
            caches = [out[k] for k in self.present]
            ids, past = np.array([[token]], np.int64), past + n


@serve.deployment
class GenerationDeployment:
    """One replica of a decoder with its KV cache (``model``: an ONNX file or
    an anyshape artifact): ``generate(prompt, max_new_tokens, eos_token_id)``
    streams the new tokens (greedy). ``backend``, ``dims``, ``threads``: as
    `ModelDeployment`'s. ``max_new_tokens``: the most a request gets.
    ``concurrent``: requests whose steps run at once (each on a thread of the
    replica, the model's threads shared)."""

    def __init__(
        self,
        model: str,
        backend: str = "anyshape",
        dims: Optional[Mapping[str, Tuple[int, int]]] = None,
        threads: Optional[int] = None,
        max_new_tokens: int = 64,
        concurrent: int = 4,
    ) -> None:
        run, ins, outs = _open(model, backend, dims, threads)
        self.generator = _Generator(run, ins, outs)
        self.max_new_tokens = max_new_tokens
        self.executor = ThreadPoolExecutor(max(1, concurrent))

    async def generate(self, prompt: Any, max_new_tokens: Optional[int] = None, eos_token_id: Optional[int] = None):
        ids = self.generator.check(prompt)
        n = self.max_new_tokens if max_new_tokens is None else min(int(max_new_tokens), self.max_new_tokens)
        steps = self.generator.steps(ids, n, eos_token_id)
        loop = asyncio.get_running_loop()
        done = object()
        while True:
            # A step runs on the replica's threads (the GIL released while the model
            # runs), so that other requests' steps and new requests go on meanwhile.
            token = await loop.run_in_executor(self.executor, next, steps, done)
            if token is done:
                return
            yield token


@serve.deployment
class ModelDeployment:
    """One replica: a session over ``model`` (an ONNX file or an anyshape
    artifact) and a dynamic batch of concurrent requests.

    ``backend``: ``"anyshape"`` or ``"onnxruntime"``. ``dims``: ranges of
    symbolic dims (ONNX models). ``threads``: threads per replica.
    ``max_batch_size`` and ``batch_wait_timeout_s``: how many requests one
    batch takes at most and how long it waits for more. ``max_padding``: the
    padding one call may add, as a fraction of the tokens its requests have
    (requests of lengths further apart run in separate calls).
    """

    def __init__(
        self,
        model: str,
        backend: str = "anyshape",
        dims: Optional[Mapping[str, Tuple[int, int]]] = None,
        threads: Optional[int] = None,
        max_batch_size: int = 16,
        batch_wait_timeout_s: float = 0.002,
        max_padding: float = 0.1,
    ) -> None:
        run, ins, outs = _open(model, backend, dims, threads)
        self.batcher = _Batcher(run, ins, outs, max_padding)
        self._batch.set_max_batch_size(max_batch_size)
        self._batch.set_batch_wait_timeout_s(batch_wait_timeout_s)

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.002)
    async def _batch(self, requests: List[Dict[str, np.ndarray]]) -> List[Any]:
        loop = asyncio.get_running_loop()
        # The model runs in a worker thread (the GIL is released while it runs),
        # so that the replica takes the next batch's requests meanwhile.
        try:
            return await loop.run_in_executor(None, self.batcher.run_all, requests)
        except Exception as e:  # one failed call answers each of its requests
            return [e] * len(requests)

    async def infer(self, feeds: Mapping[str, Any]) -> Dict[str, np.ndarray]:
        """Run one request (a mapping of input names to arrays with a batch axis)."""
        checked = self.batcher.check(feeds)
        out = await self._batch(checked)
        if isinstance(out, Exception):
            raise out
        return out

    async def __call__(self, request: Request) -> JSONResponse:
        try:
            body = await request.body()
            try:
                doc = json.loads(body)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise RequestError(f"the body is not JSON: {e}") from None
            if not isinstance(doc, dict) or "inputs" not in doc:
                raise RequestError('the body must be an object {"inputs": {name: array, ...}}')
            out = await self.infer(doc["inputs"])
        except (RequestError, anyshape.InvalidArgument) as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        return JSONResponse({"outputs": {k: v.tolist() for k, v in out.items()}})


def build(args: Dict[str, Any]):
    """The application a Serve config file names (``import_path:
    anyshape.serve:build``): ``args`` are `ModelDeployment`'s arguments,
    checked here (a misspelt option is an error when the config is applied,
    not when a replica starts)."""
    import inspect

    args = dict(args)
    params = [p for p in inspect.signature(ModelDeployment.func_or_class.__init__).parameters if p != "self"]
    unknown = [k for k in args if k not in params]
    if unknown or "model" not in args:
        raise TypeError(f"anyshape.serve.build: unknown arguments {unknown} or no 'model' (it takes {params})")
    model = args.pop("model")
    return ModelDeployment.bind(model, **args)
