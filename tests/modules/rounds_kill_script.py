"""One training process of tests/modules/test_mid_round_resume_kill.py: tests/modules/mid_epoch_kill_script.py
(same arguments) with the MARLHF families of that test added to test_mid_epoch_resume.FAMILIES."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import mid_epoch_kill_script  # noqa: E402  (tests/modules on the path)
import test_mid_epoch_resume  # noqa: E402
from test_mid_round_resume_kill import EXTRA_FAMILIES  # noqa: E402

if __name__ == "__main__":
    test_mid_epoch_resume.FAMILIES.update(EXTRA_FAMILIES)
    mid_epoch_kill_script.main()
