"""A model's forward graph run by PyTorch, op by op, for the oracle tests: the loss and, by torch's own
autograd, every parameter's gradient. Under ``torch.autocast`` PyTorch chooses each op's precision itself,
so the twin knows nothing of swapdsl's precision pass, its kernels or its autodiff."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from swapdsl.graph.ir import Graph

DTYPES = {"f64": torch.float64, "f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
          "i32": torch.int32, "i64": torch.int64}


def _xent(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1).long())


def _slice(x: torch.Tensor, axis: int, start: int, stop: int, step: int) -> torch.Tensor:
    index = [slice(None)] * x.dim()
    index[axis] = slice(start, stop, step)
    return x[tuple(index)]


# op name -> (its inputs, its attributes) -> the result, as PyTorch computes it

def _rope(x: Any, base: float) -> Any:
    """LLaMA's rotary embedding as its reference code writes it (rotate_half, cos and sin tables)."""
    t, d = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    angle = torch.outer(torch.arange(t, dtype=torch.float64), inv_freq)
    emb = torch.cat([angle, angle], dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin

OPS: dict[str, Callable[..., torch.Tensor]] = {
    "matmul": lambda a, x, y: torch.matmul(x, y),
    "matmul_nt": lambda a, x, y: torch.matmul(x, y.transpose(-1, -2)),
    "add": lambda a, x, y: x + y,
    "sub": lambda a, x, y: x - y,
    "mul": lambda a, x, y: x * y,
    "div": lambda a, x, y: x / y,
    "neg": lambda a, x: -x,
    "add_scalar": lambda a, x: x + a["value"],
    "mul_scalar": lambda a, x: x * a["value"],
    "relu": lambda a, x: torch.relu(x),
    "gelu": lambda a, x: F.gelu(x, approximate="tanh"),
    "tanh": lambda a, x: torch.tanh(x),
    "sigmoid": lambda a, x: torch.sigmoid(x),
    "silu": lambda a, x: F.silu(x),
    "erf": lambda a, x: torch.erf(x),
    "leaky_relu": lambda a, x: F.leaky_relu(x, a["slope"]),
    "exp": lambda a, x: torch.exp(x),
    "log": lambda a, x: torch.log(x),
    "sqrt": lambda a, x: torch.sqrt(x),
    "softmax": lambda a, x: torch.softmax(x, dim=a["axis"]),
    "log_softmax": lambda a, x: torch.log_softmax(x, dim=a["axis"]),
    "softmax_cross_entropy": lambda a, x, y: _xent(x, y),
    "mse_loss": lambda a, x, y: F.mse_loss(x, y),
    "layer_norm": lambda a, x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, a["eps"]),
    "rope": lambda a, x: _rope(x, a["base"]),
    "causal_mask": lambda a, x: x.masked_fill(torch.ones(x.shape[-2:], dtype=torch.bool).triu(1), a["fill"]),
    "rms_norm": lambda a, x, w: F.rms_norm(x, tuple(w.shape), w, a["eps"]),
    "batch_norm": lambda a, x, w, b: F.batch_norm(x, None, None, w, b, training=True, eps=a["eps"]),
    "conv2d": lambda a, x, w: F.conv2d(x, w, None, a["stride"], a["padding"], a["dilation"], a["groups"]),
    "global_avg_pool": lambda a, x: x.mean(dim=(2, 3)),
    "embedding": lambda a, ids, table: F.embedding(ids.long(), table),
    "reshape": lambda a, x: x.reshape(a["shape"]),
    "permute": lambda a, x: x.permute(a["perm"]),
    "slice": lambda a, x: _slice(x, a["axis"], a["start"], a["stop"], a["step"]),
    "concat": lambda a, *xs: torch.cat(xs, dim=a["axis"]),
    "fill": lambda a: torch.full(a["shape"], a["value"], dtype=DTYPES[a["dtype"]]),
    "cast": lambda a, x: x.to(DTYPES[a["dtype"]]),
    "sum": lambda a, x: x.sum(dim=a["axes"], keepdim=a["keepdims"]),
    "mean": lambda a, x: x.mean(dim=a["axes"], keepdim=a["keepdims"]),
    "argmax": lambda a, x: torch.argmax(x, dim=a["axis"]).int(),
    "equal": lambda a, x, y: (x == y).to(x.dtype),
}


def loss_and_grads(g: Graph, values: Mapping[str, np.ndarray], autocast: str | None = None
                   ) -> tuple[float, dict[str, np.ndarray]]:
    """``g``'s loss on ``values`` (inputs and parameters) and the gradient of each parameter, in f64 numpy
    arrays; ``autocast``: "bf16" or "f16" runs the forward pass under ``torch.autocast("cpu", ...)``."""
    env: dict[str, Any] = {name: torch.from_numpy(np.array(values[name])) for name in g.inputs}
    params = {name: torch.from_numpy(np.array(values[name])).requires_grad_(True) for name in g.params}
    env |= params
    with torch.autocast("cpu", dtype=DTYPES[autocast or "bf16"], enabled=autocast is not None):
        for op in g.ops:
            env[op.outputs[0]] = OPS[op.op](op.attr_dict, *(env[n] for n in op.inputs))
    loss = env[g.loss].float()
    loss.backward()
    return float(loss.detach()), {n: p.grad.double().numpy() for n, p in params.items() if p.grad is not None}


def train(g: Graph, values: Mapping[str, np.ndarray], steps: int, make_optimizer: Callable[[list], Any],
          make_schedule: Callable[[Any], Any] | None = None, clip: float = 0.0) -> tuple[list[float], list[float],
                                                                                       dict[str, np.ndarray]]:
    """``steps`` of training ``g``'s forward graph with a torch.optim optimiser (and lr scheduler, and
    ``clip_grad_norm_``) on one fixed batch: (losses, learning rates used, parameters after)."""
    inputs = {name: torch.from_numpy(np.array(values[name])) for name in g.inputs}
    params = {name: torch.from_numpy(np.array(values[name])).requires_grad_(True) for name in g.params}
    opt = make_optimizer(list(params.values()))
    schedule = make_schedule(opt) if make_schedule is not None else None
    losses, rates = [], []
    for _ in range(steps):
        opt.zero_grad()
        env: dict[str, Any] = {**inputs, **params}
        for op in g.ops:
            env[op.outputs[0]] = OPS[op.op](op.attr_dict, *(env[n] for n in op.inputs))
        loss = env[g.loss]
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(list(params.values()), clip)
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        if schedule is not None:
            schedule.step()
        losses.append(float(loss.detach()))
    return losses, rates, {n: p.detach().numpy().copy() for n, p in params.items()}
