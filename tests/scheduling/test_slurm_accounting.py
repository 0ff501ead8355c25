"""Reading Slurm's books: sacct's lines as the reader parses them. The real slurmdbd is in
tests/provisioning/test_slurm_books.py."""

from datetime import UTC, datetime

import pytest

from scheduling.slurm.accounting import gpus_of, parse_line


def test_an_ended_job_line():
    books = parse_line(
        "17|5400|billing=2,cpu=2,gres/gpu=2,gres/gpu:a100=2,mem=4G,node=1|1790000000|1790005400|COMPLETED"
    )
    assert (books.job_id, books.gpus, books.elapsed_seconds, books.state) == (17, 2, 5400, "COMPLETED")
    assert books.started_at == datetime.fromtimestamp(1790000000, tz=UTC) and books.ended
    assert books.card_hours == 3.0  # 2 GPUs x 1.5 h


def test_a_running_job_has_no_end_and_its_elapsed_so_far():
    books = parse_line("18|60|cpu=1,gres/gpu=1,node=1|1790000000|Unknown|RUNNING")
    assert books.ended_at is None and not books.ended and books.card_hours == pytest.approx(1 / 60)


@pytest.mark.parametrize("line", ["", "18_3|60|gres/gpu=1|0|Unknown|PENDING", "19+1|1|x|1|1|COMPLETED", "a|b|c"])
def test_lines_that_are_not_a_plain_job_are_left_out(line):
    assert parse_line(line) is None


def test_gpus_of_a_job_without_gpus_is_zero():
    assert gpus_of("billing=1,cpu=1,mem=256M,node=1") == 0
