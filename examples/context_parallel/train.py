"""A few training steps of a small causal language model whose sequence is split across the GPUs of
one host with tilecore.distributed: each rank holds its zigzag slice of every sequence (tokens,
targets and positions alike), attention runs across ranks (ring or all-to-all), everything else is
per token and stays local; parameter gradients are summed over the ranks.

    torchrun --nproc_per_node=2 examples/context_parallel/train.py                 (CUDA, NCCL)
    torchrun --nproc_per_node=2 examples/context_parallel/train.py --cpu --seq 256 (CPU, gloo)

--check compares the first step's loss and gradients with one process running the same model
(tilecore.attention) on the whole sequence.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout

import tilecore  # noqa: E402
from tilecore.distributed import context_parallel_attention, zigzag_shard  # noqa: E402


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, attend):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.norm1, self.norm2 = nn.RMSNorm(dim), nn.RMSNorm(dim)
        self.qkv = nn.Linear(dim, (heads + 2 * kv_heads) * self.head_dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim, bias=False), nn.GELU(), nn.Linear(4 * dim, dim, bias=False))
        self.attend = attend

    def forward(self, x):  # x: (batch, tokens, dim), this rank's tokens
        b, n, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(
            [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], -1)
        q, k, v = (t.view(b, n, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))  # (b, heads, n, d)
        o = self.attend(q, k, v).transpose(1, 2).reshape(b, n, -1)
        x = x + self.proj(o)
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, kv_heads: int, max_seq: int, attend):
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab, dim), nn.Embedding(max_seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, kv_heads, attend) for _ in range(layers))
        self.norm, self.head = nn.RMSNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens, positions):  # positions: each token's place in the whole sequence
        x = self.embed(tokens) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", action="store_true", help="CPU tensors on gloo")
    p.add_argument("--mode", default="ring", choices=["ring", "all_to_all"])
    p.add_argument("--seq", type=int, default=16384, help="tokens a sequence (whole, before the split)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--check", action="store_true", help="compare step 1 with one process on the whole sequence")
    args = p.parse_args()
    if args.dim % args.heads or args.heads % args.kv_heads:
        p.error(f"--dim ({args.dim}) must divide by --heads ({args.heads}), and --heads by --kv-heads "
                f"({args.kv_heads})")

    if args.cpu:
        dist.init_process_group("gloo")
        device, dtype = torch.device("cpu"), torch.float32
    else:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl")
        device, dtype = torch.device("cuda"), torch.bfloat16
    rank, world = dist.get_rank(), dist.get_world_size()

    def attend(q, k, v):
        return context_parallel_attention(q, k, v, causal=True, mode=args.mode)

    torch.manual_seed(0)  # the same initial weights on every rank
    model = TinyLM(args.vocab, args.dim, args.layers, args.heads, args.kv_heads, args.seq, attend).to(device, dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(1)  # the same batches on every rank; each keeps its slice

    for step in range(1, args.steps + 1):
        # a learnable toy task: each token is the previous one plus one (mod vocab), from a random start
        start = torch.randint(args.vocab, (args.batch, 1), generator=data)
        seq = (start + torch.arange(args.seq + 1)) % args.vocab
        tokens, targets = seq[:, :-1], seq[:, 1:]
        positions = torch.arange(args.seq).expand(args.batch, -1)
        tokens, targets, positions = (zigzag_shard(t, 1).to(device) for t in (tokens, targets, positions))

        began = time.perf_counter()
        logits = model(tokens, positions)
        # the mean over every rank's tokens: each rank sums its own, divided by the whole count
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum")
        loss = loss / (args.batch * args.seq)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        for param in model.parameters():  # every rank's share of each parameter's gradient
            dist.all_reduce(param.grad)
        whole_loss = loss.detach().clone()
        dist.all_reduce(whole_loss)
        if args.check and step == 1:
            check_against_one_process(model, args, seq, device, dtype, whole_loss, rank)
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if rank == 0:
            print(f"step {step}: loss {whole_loss.item():.4f} ({(time.perf_counter() - began) * 1e3:.0f} ms, "
                  f"{args.seq} tokens over {world} ranks, {args.mode})", flush=True)
    dist.destroy_process_group()
    return 0


def check_against_one_process(model, args, seq, device, dtype, whole_loss, rank):
    """Step 1 again in this process alone, the whole sequence through tilecore.attention: the loss
    and every parameter's gradient against the context-parallel ones (already summed over ranks)."""
    import copy

    single = copy.deepcopy(model)
    for block in single.blocks:
        block.attend = lambda q, k, v: tilecore.attention(q, k, v, causal=True)
    tokens, targets = seq[:, :-1].to(device), seq[:, 1:].to(device)
    positions = torch.arange(args.seq, device=device).expand(args.batch, -1)
    single.zero_grad(set_to_none=True)
    loss = F.cross_entropy(single(tokens, positions).float().flatten(0, 1), targets.flatten())
    loss.backward()
    worst = max(((a.grad.float() - b.grad.float()).norm() / b.grad.float().norm().clamp_min(1e-30)).item()
                for a, b in zip(model.parameters(), single.parameters()))
    if rank == 0:
        print(f"check: loss {whole_loss.item():.6f} against one process's {loss.item():.6f}; gradients' worst "
              f"relative difference {worst:.2e} ({str(dtype)[6:]})", flush=True)


if __name__ == "__main__":
    sys.exit(main())
