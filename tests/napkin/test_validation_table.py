"""docs/napkin.md's predicted-over-measured table is regenerated from every committed bench JSON and
must match the file (so it cannot go stale); every miss over 15% has a named cause."""
import json

from tilecore.napkin import validate


def test_docs_table_is_current():
    text = validate.table()
    assert validate.docs_section() == text, (
        "docs/napkin.md's napkin-validate section is stale: run `tilecore napkin --validate --docs "
        "docs/napkin.md` (or python -c \"from tilecore.napkin import validate as v; v.write_docs(v.DOCS, "
        "v.table())\") and commit the result")


def test_every_committed_row_is_predicted_and_every_miss_named():
    files = validate.bench_files()
    preds = validate.predict_all()
    assert len(preds) == sum(len(d["rows"]) for _, d in files) > 400
    assert {p.file for p in preds} == {str(f.relative_to(validate.ROOT)) for f, _ in files}
    for p in preds:
        assert p.predicted > 0 and p.measured > 0
        assert (p.miss > validate.TOLERANCE) == bool(p.cause), p
        assert p.cause != "unexplained", p
    dist = validate.distribution(preds)
    assert 0 <= dist["median"] <= dist["p90"] and 0 < dist["within"] <= 1
    heads = [p for p in preds if p.headline]
    assert {p.op for p in heads} >= {"gemm", "gemm_fp8", "attention fwd", "attention bwd", "decode", "hadamard", "copy"}


def test_a_new_bench_file_joins_the_table(tmp_path):
    data = json.loads((validate.RESULTS / "h100-80gb-hbm3" / "copy.json").read_text())
    data["rows"] = data["rows"][-4:]
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "copy.json").write_text(json.dumps(data))
    preds = validate.predict_all(tmp_path)
    assert len(preds) == 4 and all(abs(p.ratio - 1) < 0.05 for p in preds)   # 1-2 GiB copies: at the ceiling
    data["suite"] = "unknown-suite"
    (tmp_path / "a" / "b" / "copy.json").write_text(json.dumps(data))
    try:
        validate.predict_all(tmp_path)
    except ValueError as e:
        assert "no prediction" in str(e)
    else:
        raise AssertionError("a row the napkin cannot predict must be an error, not dropped")
