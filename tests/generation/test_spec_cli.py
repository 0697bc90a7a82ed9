"""``llamapy run --spec-type ...``: the same greedy text with n-gram drafts; an MTP request on a model
without MTP layers, a bad size, an unknown type: ``error: ...`` or a usage error, exit code not 0."""

from __future__ import annotations

import pytest

from llamapy.cli import main

PROMPT = "Repeat after me.\n" + "The cat sat on the mat, and the dog sat on the log.\n" * 3


def _run(capfd, *args: str) -> tuple[int, str, str]:
    rc = main(["run", *args])
    out, err = capfd.readouterr()
    return rc, out, err


@pytest.mark.slow
def test_run_spec_type_ngram_same_text(smollm2_path, capfd) -> None:
    base = ["-m", str(smollm2_path), "-p", PROMPT, "-n", "24", "--temp", "0", "-c", "256"]
    rc, plain, _ = _run(capfd, *base)
    assert rc == 0
    for spec in (
        ["--spec-type", "ngram-simple"],
        ["--spec-type", "ngram-map-k", "--spec-ngram-map-k-size-n", "4"],
    ):
        rc, out, err = _run(capfd, *base, *spec)
        assert rc == 0, err
        assert out == plain


def test_run_spec_type_errors(smollm2_path, capfd) -> None:
    rc, _, err = _run(
        capfd, "-m", str(smollm2_path), "-p", "hi", "-n", "2", "--spec-type", "mtp", "-c", "256"
    )
    assert rc == 1 and err.strip().splitlines()[-1].startswith("error:") and "MTP" in err
    for bad in (["--spec-type", "eagle9"], ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "0"],
                ["--mmproj-cache-mb", "nan"], ["--mmproj-cache-mb", "-1"]):  # fmt: skip
        with pytest.raises(SystemExit) as e:
            main(["run", "-m", str(smollm2_path), "-p", "hi", *bad])
        assert e.value.code == 2
        capfd.readouterr()
