"""The scaling section of BENCHMARKS.md (issue 47): a file from before the rules reads "not validated"
with its poll, a validated file reads "validated", and where the modelled scale is not validated its
target is not judged. Fakes of scaling.json; milliseconds."""

from __future__ import annotations

from report_ops import scaling


def doc(ratio: dict | None = None, met: bool = True) -> dict:
    d = {
        "rows": [
            {
                "kind": "modelled",
                "system": s,
                "gpus": 1024,
                "predicted_s": p,
                "data_path_s": 1.0,
                "data_path_share": 0.01,
            }
            for s, p in (("conduit", 9.0), ("tq_simplestorage", 10.0))
        ],  # fmt: skip
        "summary": {
            "target": "t",
            "met": met,
            "conduit_over_tq_iteration": {"1024": 0.9},
            "simplestorage_poll_s": 0.02,
        },  # fmt: skip
        "calibration": {"poll_s": 2.0 if ratio is None else 0.02},
        "measured": {"setup": {"poll_s": 0.02}},
    }
    if ratio is not None:
        d["validation"] = {"ratio": ratio}
    return d


def ratio(ok: bool) -> dict:
    return {"validated": ok, "why": "because", "rule": "the rule", "tolerance": 0.05, "claimed_ratio": 0.9,
            "claimed_at_gpus": 1024, "claimed_effect": 0.1, "tolerance_below_effect": True,
            "held_out": [{"nodes": 2, "measured_ratio": 0.88, "modelled_ratio": 0.9, "difference": 0.02,
                          "within": ok}]}  # fmt: skip


def test_a_file_from_before_the_rules_reads_not_validated_with_its_poll():
    text = "\n".join(scaling(doc()))
    assert "made before issue 47's rules (2 s SimpleStorage poll, ratio not validated)" in text
    assert "conduit ÷ tq_simplestorage iteration (not validated)" in text
    assert "not judged: the modelled scale is not validated" in text and ": met;" not in text


def test_a_validated_file_reads_validated_and_its_target_is_judged():
    text = "\n".join(scaling(doc(ratio(True))))
    assert "- Modelled scale: validated (because)" in text and "not validated" not in text
    assert "| 2 | 0.880 | 0.900 | 0.020 | yes |" in text
    assert "poll: 0.02 s modelled, 0.02 s measured" in text and ": met;" in text


def test_a_file_that_failed_the_ratio_reads_not_validated_and_claims_no_target():
    text = "\n".join(scaling(doc(ratio(False))))
    assert "- Modelled scale: **not validated** (because)" in text
    assert "not judged: the modelled scale is not validated" in text and ": met;" not in text
