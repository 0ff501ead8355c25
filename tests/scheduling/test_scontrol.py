"""scontrol's answers classified: slurmctld out of reach is an outage the steps wait out (BackendUnavailable), a
refusal stays a refusal. scontrol is replaced by a script printing Slurm's own messages (the real one needs a
controller down on purpose, which tests/provisioning/test_slurm_faults.py does for slurmrestd's path)."""

import stat

import pytest

from provisioning.drivers.base import BackendUnavailable, scontrol_outage
from scheduling.slurm import scontrol


def _scontrol(tmp_path, settings, *, prints: str, status: int = 1):
    script = tmp_path / "scontrol"
    script.write_text(f"#!/bin/sh\necho '{prints}' >&2\nexit {status}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    settings.SLURM_SCONTROL, settings.SLURM_CONF = str(script), ""


@pytest.mark.parametrize(
    "prints",
    [
        "slurm_create_reservation error: Unable to contact slurm controller (connect failure)",
        "delete_reservation cc-reservation-7: Socket timed out on send/recv operation",
    ],
)
def test_a_controller_out_of_reach_is_an_outage_waited_out(tmp_path, settings, prints):
    _scontrol(tmp_path, settings, prints=prints)
    with pytest.raises(scontrol.ScontrolUnreachable) as unreachable:
        scontrol.delete_reservation("cc-reservation-7")
    outage = scontrol_outage(unreachable.value)
    assert isinstance(outage, BackendUnavailable) and outage.retryable and outage.whole_backend
    assert (outage.code, outage.waiting_for) == ("slurm_unavailable", "slurmctld")


def test_a_refusal_stays_a_refusal(tmp_path, settings):
    _scontrol(tmp_path, settings, prints="Error creating the reservation: Requested nodes are busy")
    with pytest.raises(scontrol.ScontrolError) as refused:
        scontrol.create_reservation("cc-reservation-7", users="slurmrest", nodes=["n1"], minutes=60)
    assert not isinstance(refused.value, scontrol.ScontrolUnreachable)
    assert "Requested nodes are busy" in str(refused.value)
