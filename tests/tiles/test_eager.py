"""tiles.eager: eager calls that record a gradient go through an autograd.Function built from the op's
own autograd pieces, and give the custom op's results and gradients bit for bit."""
import pytest
import torch
from torch.overrides import TorchFunctionMode

from tilecore import dispatch
from tilecore.ops.norm.op import layer_norm
from tilecore.ops.attention_varlen import attention_varlen
from tilecore.ops.rotary.op import apply_rotary


class _Passthrough(TorchFunctionMode):
    """A mode that changes nothing but makes every call take the custom op (eager_mode "op")."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _grads(fn, leaves, seed):
    out = fn()
    outs = out if isinstance(out, tuple) else (out,)
    gen = torch.Generator().manual_seed(seed)
    cotangents = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in outs]
    return outs, torch.autograd.grad(outs, leaves, cotangents)


def _norm_case():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 40, generator=gen).requires_grad_()
    w = torch.randn(40, generator=gen).requires_grad_()
    b = torch.randn(40, generator=gen).requires_grad_()
    r = torch.randn(6, 40, generator=gen).requires_grad_()
    return (lambda: layer_norm(x, w, b, residual=r, prenorm=True)), [x, w, b, r]


def _rotary_case():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, 3, 16, generator=gen).requires_grad_()
    cos, sin = torch.randn(8, 6, generator=gen), torch.randn(8, 6, generator=gen)
    return (lambda: apply_rotary(x, cos, sin)), [x]


def _varlen_case():
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(9, 2, 16, generator=gen).requires_grad_() for _ in range(3))
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    return (lambda: attention_varlen(q, k, v, cu, cu, 5, 5, causal=True, return_lse=True)), [q, k, v]


@pytest.mark.parametrize("case", [_norm_case, _rotary_case, _varlen_case],
                         ids=["layer_norm", "apply_rotary", "attention_varlen"])
def test_eager_function_matches_the_custom_op(case):
    fn, leaves = case()
    assert dispatch.eager_mode(*leaves) == "autograd"
    outs, grads = _grads(fn, leaves, seed=2)
    with _Passthrough():
        assert dispatch.eager_mode(*leaves) == "op"
        op_outs, op_grads = _grads(fn, leaves, seed=2)
    for a, b in zip(outs + grads, op_outs + op_grads):
        assert torch.equal(a, b)
    # the eager path recorded a graph of its own Function, not the custom op's
    out = fn()
    assert any(name.startswith(("_LayerNormFunction", "_RotaryFunction", "_VarlenFunction"))
               for name in _graph_nodes(out))


def _graph_nodes(out):
    outs = out if isinstance(out, tuple) else (out,)
    stack, names = [o.grad_fn for o in outs], set()
    while stack:
        node = stack.pop()
        if node is None or type(node).__name__ in names:
            continue
        names.add(type(node).__name__)
        stack.extend(n for n, _ in node.next_functions)
    return names


def test_unused_output_gradient_is_none_not_zeros():
    fn, leaves = _norm_case()
    y, h = fn()
    (dx,) = torch.autograd.grad(h.sum(), [leaves[0]])  # only the residual stream used
    assert torch.equal(dx, torch.ones_like(dx))


def _rotate_reference(x, cos, sin):
    half = cos.shape[1]
    c, s = cos[: x.shape[1], None, :], sin[: x.shape[1], None, :]
    x1, x2 = x[..., :half], x[..., half: 2 * half]
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c, x[..., 2 * half:]], dim=-1)


def test_double_backward_goes_through_the_op():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1, 4, 2, 8, generator=gen).requires_grad_()
    cos, sin = torch.randn(4, 4, generator=gen), torch.randn(4, 4, generator=gen)
    results = []
    for rotate in (apply_rotary, _rotate_reference):
        y = rotate(x, cos, sin)
        (g,) = torch.autograd.grad(y.square().sum(), [x], create_graph=True)
        (gg,) = torch.autograd.grad(g.square().sum(), [x])
        results.append(gg)
    assert torch.allclose(results[0], results[1], rtol=1e-4, atol=1e-4)
    assert results[0].abs().max() > 0
