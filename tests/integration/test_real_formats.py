"""The input formats real teams bring, written by the test itself: Criteo's display-advertising
sample as a CSV with a header, empty fields and hexadecimal ids, trained end to end with the
text example's features (hashed ids). MovieLens-style files (quoted titles, ``|`` genres, a
derived label) are in ``test_labels_e2e.py``."""

from __future__ import annotations

import math
import random
import re
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.integration.test_update_path import _process_group  # noqa: F401
from tzrun.config.load import load_config, parse_config
from tzrun.kernel.plugins import make_plugin_manager
from tzrun.kernel.registry import collect_registries
from tzrun.runner.trainer import train
from tzrun.runner.session import Session

pytestmark = pytest.mark.slow

HEADER = ["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))]


def _write_criteo_sample(path: Path, rows: int, seed: int) -> None:
    """Rows like dac_sample's: counts with many empty fields, 8-hex-digit ids, some empty."""
    rng = random.Random(seed)
    lines = [",".join(HEADER)]
    for _ in range(rows):
        ids = ["" if rng.random() < 0.1 else f"{rng.randrange(16 ** 3) * 4099 % 16 ** 8:08x}" for _ in range(26)]
        counts = ["" if rng.random() < 0.2 else str(int(rng.expovariate(0.3))) for _ in range(13)]
        click = int(rng.random() < 0.25)
        lines.append(",".join([str(click), *counts, *ids]))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def test_criteo_display_ads_csv_with_header_empty_fields_and_hex_ids_trains(tmp_path):
    _write_criteo_sample(tmp_path / "data" / "train" / "part-0.csv", 3000, seed=1)
    _write_criteo_sample(tmp_path / "data" / "eval" / "part-0.csv", 1000, seed=2)
    text = (REPO / "examples" / "deepfm_criteo_text.toml").read_text()
    # the sample's header names the columns: the headerless example's column_names go
    text, n = re.subn(r'delimiter = "\\t"\nheader = false\ncolumn_names = \[[^\]]*\]\n', 'delimiter = ","\nheader = true\n', text)
    assert n == 1
    pm = make_plugin_manager()
    registries = collect_registries(pm)
    raw = parse_config(text, "<criteo sample>", [
        f'data.train_input="{tmp_path / "data" / "train"}"', f'data.eval_input="{tmp_path / "data" / "eval"}"',
        f'model_dir="{tmp_path / "run"}"', "data.batch_size=256", "data.eval_batch_size=500",
        "model.deep_hidden_units=[16]", "model.final_hidden_units=[8]", "train.num_epochs=2",
    ])
    result = train(Session(load_config(raw, registries), raw, pm, registries))
    assert result.steps == 24 and result.eval is not None and result.eval.rows == 1000  # every row read, none bad
    assert math.isfinite(result.eval.metrics["auc"]) and math.isfinite(result.eval.metrics["loss/binary_cross_entropy"])


def test_headerless_criteo_text_with_a_derived_label_checks_and_trains(tmp_path):
    """The documented derived label on the headerless text example: the run reads the label's
    source column ('label', named by column_names), never its name ('clicked'); ``check`` used to
    refuse it because it asked for 'clicked'."""
    lines = (tmp_path / "x.csv", tmp_path / "y.csv")
    _write_criteo_sample(lines[0], 1200, seed=3)
    _write_criteo_sample(lines[1], 400, seed=4)
    for src, split in zip(lines, ("train", "eval")):
        out = tmp_path / "data" / split / "part-0.txt"
        out.parent.mkdir(parents=True)
        out.write_text("".join(line.replace(",", "\t") + "\n" for line in src.read_text().splitlines()[1:]))
    text = (REPO / "examples" / "deepfm_criteo_text.toml").read_text()
    text = text.replace('labels = ["label"]', 'labels = ["clicked"]\n\n[[data.derived_labels]]\nname = "clicked"\n'
                                               'source = "label"\nop = ">"\nvalue = 0.5', 1)
    assert 'labels = ["clicked"]' in text
    session = Session.from_raw(parse_config(text, "<derived label>", [
        f'data.train_input="{tmp_path / "data" / "train"}"', f'data.eval_input="{tmp_path / "data" / "eval"}"',
        f'model_dir="{tmp_path / "run"}"', "data.batch_size=200", "data.eval_batch_size=400",
        "model.deep_hidden_units=[16]", "model.final_hidden_units=[8]",
    ]))
    session.check()  # raised ConfigError ("reads column(s) 'clicked'") before
    result = train(session)
    assert result.steps == 6 and result.eval is not None and result.eval.rows == 400
    assert math.isfinite(result.eval.metrics["auc"])
