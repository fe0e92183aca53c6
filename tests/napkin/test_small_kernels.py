"""Small kernels by GPU time (issue 36, session 39): the launch constants, the tl Hadamard kernel's chain and the
split-key decode kernel's chain, each re-derived here from the measured rows it comes from and checked on the rows
it was not derived from (notes/napkin/README.md, "Small kernels")."""
import dataclasses
import json
import statistics
from pathlib import Path

import pytest

from tilecore.napkin import H100, models, validate
from tilecore.napkin.engine import group, relabel

RUNS = Path(validate.ROOT) / "notes" / "napkin" / "runs"
SMALL = RUNS / "small_kernels_run1_session39_h100_napkin_small_kernels.json"


def _bench(name):
    return dict((p.name, d) for p, d in validate.bench_files())[name]


def _graph_gpu(data):
    gpu = validate.session_gpu(data, validate.lab_gpu())
    return dataclasses.replace(gpu, launch_s=gpu.graph_launch_s, key=gpu.key + "-graph")


def _run_rows():
    return {r["name"]: r for r in json.loads(SMALL.read_text())["rows"]}


def test_launch_constants_are_small_copies_less_the_engine():
    # graph: the hadamard-latency suite's 8 KiB copy; eager: copy.json's 64 KiB-1 MiB copies (their median)
    lat = _bench("hadamard-latency.json")
    gpu = validate.session_gpu(lat, validate.lab_gpu())
    row = next(r for r in lat["rows"] if r["series"] == "torch copy_" and r["params"] == {"rows": 1, "n": 4096})
    assert validate.launch_from_copy(row["ms"] * 1e-3, 8192, gpu) == pytest.approx(H100.graph_launch_s, abs=0.01e-6)
    cp = _bench("copy.json")
    gpu = validate.session_gpu(cp, validate.lab_gpu())
    eager = [validate.launch_from_copy(r["ms"] * 1e-3, r["params"]["bytes"], gpu) for r in cp["rows"]
             if 65536 <= r["params"]["bytes"] <= 1 << 20]
    assert len(eager) == 10 and statistics.median(eager) == pytest.approx(H100.launch_s, abs=0.01e-6)
    # each within 0.1 us of an empty kernel's measured time: 0.84 us from a graph (session 39), 4.18 eager (26)
    assert H100.graph_launch_s == pytest.approx(_run_rows()["empty kernel"]["graph_us"] * 1e-6, abs=0.1e-6)
    consts = json.loads((RUNS / "napkin_gpu_constants_session26_h100.json").read_text())["constants"]
    assert H100.launch_s == pytest.approx(consts["empty_launch_s"], abs=0.1e-6)


def test_a_lone_block_has_its_sm_and_few_sms_cannot_draw_all_of_hbm():
    gpu = H100
    one = relabel(models.copy(n=4096), gpu, {"i": group(4096)})          # 16 KiB through one SM
    smem = gpu.level("SMEM")
    assert one.times["SMEM"] == pytest.approx(one.H["SMEM"] / (smem.bandwidth / gpu.sms))   # not a 1/16 slot's
    l2_port = gpu.level("L2").bandwidth / gpu.sms
    assert one.times["HBM"] == pytest.approx(one.H["HBM"] / l2_port)     # one SM's port, not all of HBM
    big = relabel(models.copy(n=2 ** 28), gpu, {"i": group(8192)})
    assert big.times["HBM"] == pytest.approx(big.H["HBM"] / gpu.levels[0].bandwidth)
    # a transfer-bound kernel's bytes flow after its first loads' round trip
    assert big.time == pytest.approx(big.times["HBM"] + gpu.tile_latency_s + gpu.launch_s, rel=1e-6)


def test_graph_timed_copies_and_the_runs_copies():
    # every copy of the bench's graph-timed file within 15%, and the session-39 run's copies (2 KiB-8 MiB, the same
    # builder) too, none of them derived from but the 8 KiB one
    preds = [p for p in validate.predict_all() if p.file.endswith("hadamard-latency.json") and p.op == "copy"]
    assert len(preds) == 18 and all(p.miss <= validate.TOLERANCE for p in preds)
    gpu = _graph_gpu(_bench("hadamard-latency.json"))
    for name, r in _run_rows().items():
        if name.startswith("copy"):
            kib = int(name.split()[1])
            assert r["graph_us"] * 1e-6 / validate.copy_time(kib * 1024, gpu)[0] == pytest.approx(1, abs=0.15), name


def test_hadamard_chain_constants_re_derive_from_the_two_one_row_rows():
    data = _bench("hadamard-latency.json")
    gpu = _graph_gpu(data)
    meas = {r["params"]["n"]: r["ms"] * 1e-3 for r in data["rows"]
            if r["series"] == "tilecore" and r["params"]["rows"] == 1}
    fill = {n: relabel(models.hadamard(rows=1, n=n, radix=16), gpu, {"r": group(1)}, warpgroups=2).fill_time
            for n in (4096, 16384)}
    per_sm = gpu.rate("tensor", "bf16") / gpu.sms
    mma = {n: n * (2 * 128 + 4 * 32) / per_sm for n in (4096, 16384)}     # both split 128 x 32 slices
    wait = (meas[16384] - meas[4096] - (fill[16384] - fill[4096]) - (mma[16384] - mma[4096])) / 9
    prologue = meas[4096] - gpu.launch_s - fill[4096] - mma[4096] - 3 * wait
    assert wait == pytest.approx(validate.WGMMA_WAIT_S, abs=0.005e-6)
    assert prologue == pytest.approx(validate.HADAMARD_PROLOGUE_S, abs=0.01e-6)
    for n in (4096, 16384):
        assert validate.hadamard_time(1, n, "bf16", gpu)[0] == pytest.approx(meas[n], rel=0.01)


PROGRAMS = RUNS / "small_kernels_programs_run3_session39_h100_napkin_small_kernels.json"


def test_hadamard_chain_holds_on_the_sizes_it_was_not_derived_from():
    # sessions 39's runs 1 and 3: one row of n 2048-32768 (two and four slices, 32- and 64-wide second factors),
    # 132 / 264 rows (one tile a program; at 264 rows of 4096 two programs an SM, which run in turn) and run 3's
    # 396 rows of 4096 at the plan's programs (three an SM) within 15%; n <= 1024 (several rows a tile, smaller H
    # factors: another prologue) is outside what the chain covers
    gpu = _graph_gpu(_bench("hadamard-latency.json"))
    checked = 0
    for path in (SMALL, PROGRAMS):
        for r in json.loads(path.read_text())["rows"]:
            name = r["name"]
            if not (name.startswith("hadamard") or (name.startswith("programs") and "table" in name)):
                continue
            assert r["pass"], name
            rows, n = int(name.split()[2]), int(name.split()[4])
            if n < 2048:
                continue
            t = validate.hadamard_time(rows, n, "bf16", gpu)[0]
            assert r["graph_us"] * 1e-6 / t == pytest.approx(1, abs=0.15), (path.name, name)
            checked += 1
    assert checked == 21
    # the Gluon kernel's sizes from 2^24 elements and the butterfly take no chain
    assert validate.hadamard_chain_s(4096, 16384, gpu) == 0 and validate.hadamard_chain_s(64, 8, gpu) == 0


def test_programs_on_one_sm_run_their_chains_in_turn():
    # run 3: n 4096 at 264 / 396 rows, the plan's programs (two / three an SM) against one program an SM walking
    # the same tiles: each extra program adds its prologue and its tile (2.2 us), an extra tile of one program less
    rows = {r["name"]: r["graph_us"] for r in json.loads(PROGRAMS.read_text())["rows"]}
    one = [rows[f"programs rows {k} n 4096 waves 1 grid 132"] for k in (132, 264, 396)]
    table = [rows[f"programs rows {k} n 4096 waves table grid {k}"] for k in (132, 264, 396)]
    assert one[0] == pytest.approx(table[0], rel=0.02)
    assert table[1] - table[0] > 1.5 * (one[1] - one[0]) and table[2] - table[1] > 1.5 * (one[2] - one[1])
    gpu = _graph_gpu(_bench("hadamard-latency.json"))
    step = validate.hadamard_chain_s(264, 4096, gpu) - validate.hadamard_chain_s(132, 4096, gpu)
    assert step * 1e6 == pytest.approx(table[1] - table[0], rel=0.25) and step > validate.HADAMARD_PROLOGUE_S
    # at 2^28 elements (hadamard.json: 32 programs an SM) the same sum stays within 15% of the measured rows
    preds = [p for p in validate.predict_all() if p.file.endswith("hadamard.json") and p.params["n"] in (4096, 8192)]
    assert len(preds) == 4 and all(p.miss <= validate.TOLERANCE for p in preds)


def test_decode_split_chain_re_derives_and_holds_at_longer_caches():
    rows = _run_rows()
    kern = {nk: rows[f"decode B1 Nk{nk}"]["kernels"]["attn_fwd_split_keys"] * 1e-6 for nk in (1024, 4096, 16384)}
    copy_kernel = rows["copy 8 KiB"]["kernels"]["Memcpy DtoD (Device -> Device)"] * 1e-6
    rate = _bench("attention-decode.json")["ceiling"]["value"] * 1e9
    kv = {nk: 8 * nk * 128 * 2 * 2 for nk in kern}                      # K and V, bf16
    assert kern[1024] - kv[1024] / rate - copy_kernel == pytest.approx(validate.DECODE_SPLIT_CHAIN_S, abs=0.01e-6)
    for nk in (4096, 16384):
        assert kern[nk] == pytest.approx(kv[nk] / rate + copy_kernel + validate.DECODE_SPLIT_CHAIN_S, rel=0.05)
    # tilecore's and cuDNN's graph-timed decode rows within 15% at every B and Nk
    preds = [p for p in validate.predict_all() if p.op == "decode" and not p.series.startswith("flash")]
    assert len(preds) == 18 and all(p.miss <= validate.TOLERANCE for p in preds)


def test_flash_decode_combine_re_derives_and_its_b1_rows():
    # run 7: SDPA's FlashAttention-2 decode at B1, its combine kernel at 8 splits (Nk 1024) and 32 (4096, 16384)
    rows = {r["name"]: r["kernels"] for r in json.loads((RUNS / "small_kernels_peers_run7_session39_h100_napkin_small_kernels.json")
                                                        .read_text())["rows"]}
    combine = {nk: next(v for k, v in rows[f"flash decode B1 Nk{nk}"].items() if "combine" in k or "splitkv_co" in k) * 1e-6
               for nk in (1024, 4096, 16384)}
    copy_kernel = _run_rows()["copy 8 KiB"]["kernels"]["Memcpy DtoD (Device -> Device)"] * 1e-6
    per_split = ((combine[4096] + combine[16384]) / 2 - combine[1024]) / (32 - 8)
    assert per_split == pytest.approx(validate.FLASH_COMBINE_PER_SPLIT_S, abs=0.005e-6)
    assert combine[1024] - copy_kernel - 8 * per_split == pytest.approx(validate.FLASH_COMBINE_S, abs=0.02e-6)
    assert validate.flash_decode_combine_s(16, 1024) == 0.0          # no split where the batch fills the SMs
    preds = [p for p in validate.predict_all() if p.op == "decode" and p.series.startswith("flash") and p.params["B"] == 1]
    assert len(preds) == 3 and all(p.miss <= validate.TOLERANCE for p in preds)
