"""A hand-written fake of `nvidia-smi` for the MIG commands the platform's host plans hold (no MIG card runs here).

It keeps, per card, the MIG mode, the GPU instances (profile, placement, compute instances) and the processes
running in them, runs the argv lists of `scheduling.mig` (`-mig`, `mig -cgi <profile id>:<start> -C`, `mig -gi <id>
-dci`, `mig -dgi -gi <id>`, `-L`) and refuses what a real card refuses, with nvidia-smi's words:

- a create when the card is not in MIG mode, a profile id the card does not have, a start its placement table does
  not list, memory slices another instance holds, more compute slices than are left, more instances of a profile
  than it allows, a second media-extension (+me) instance (a card has one set of JPEG/OFA engines);
- a destroy of a GPU instance that still has compute instances, or of compute instances that run processes;
- a mode change while GPU instances exist or processes run on the card.

A refusal raises `NvidiaSmiError` and changes nothing, as the real command exits non-zero.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from scheduling import mig


class NvidiaSmiError(Exception):
    """The command exited non-zero; the card is as it was."""


@dataclass
class FakeInstance:
    profile: mig.Profile
    start: int
    compute_instances: dict[int, int] = field(default_factory=dict)  # CI id -> processes running in it
    uuid: str = ""

    @property
    def size(self) -> int:
        return self.profile.memory_slices


@dataclass
class FakeGpu:
    index: int
    geometry: mig.Geometry
    mig_mode: bool = False
    instances: dict[int, FakeInstance] = field(default_factory=dict)  # GI id -> instance
    processes: int = 0  # processes on the card in whole mode

    def layout(self) -> list[tuple[str, int, int]]:
        return sorted((i.profile.name, i.start, i.size) for i in self.instances.values())


class FakeHost:
    """One host's cards. `add_instance` sets up what the card already has (as a node would report it)."""

    def __init__(self, *gpus: FakeGpu):
        self.gpus = {gpu.index: gpu for gpu in gpus}
        self.ran: list[list[str]] = []

    def add_instance(self, gpu: int, profile: str, start: int, gi_id: int, processes: int = 0) -> FakeInstance:
        card = self.gpus[gpu]
        instance = FakeInstance(card.geometry.profile(profile), start, {0: processes}, _uuid(gpu, gi_id))
        card.instances[gi_id] = instance
        return instance

    def run_all(self, commands: list[list[str]]) -> list[str]:
        return [self.run(command) for command in commands]

    def run(self, argv: list[str]) -> str:
        if argv[:1] != ["nvidia-smi"]:
            raise NvidiaSmiError(f"not an nvidia-smi command: {argv}")
        args = argv[1:]
        if args == ["-L"]:
            output = self._list()
        elif args[:1] == ["mig"]:
            output = self._mig(_options(args[1:]))
        else:
            options = _options(args)
            if "-mig" not in options:
                raise NvidiaSmiError(f"unknown command: {argv}")
            output = self._mode(self._gpu(options), options["-mig"])
        self.ran.append(argv)
        return output

    # -- commands -----------------------------------------------------------------------------------------------

    def _mode(self, gpu: FakeGpu, value: str) -> str:
        wanted = value == "1"
        if gpu.processes or any(sum(i.compute_instances.values()) for i in gpu.instances.values()):
            raise NvidiaSmiError(f"Unable to set MIG mode for GPU {gpu.index}: In use by another client")
        if gpu.instances and wanted != gpu.mig_mode:
            raise NvidiaSmiError(f"Unable to disable MIG mode for GPU {gpu.index}: GPU instances exist")
        gpu.mig_mode = wanted
        return f"{'Enabled' if wanted else 'Disabled'} MIG Mode for GPU {gpu.index}"

    def _mig(self, options: dict) -> str:
        gpu = self._gpu(options)
        if "-cgi" in options:
            return self._create(gpu, options["-cgi"], "-C" in options)
        if "-dci" in options:
            return self._destroy_compute(gpu, self._instance(gpu, options))
        if "-dgi" in options:
            return self._destroy_gpu_instance(gpu, self._instance(gpu, options))
        raise NvidiaSmiError(f"unknown mig command: {options}")

    def _create(self, gpu: FakeGpu, spec: str, default_ci: bool) -> str:
        profile_id, _, start_text = spec.partition(":")
        refused = f"Unable to create a GPU instance on GPU {gpu.index} using profile {profile_id}"
        if not gpu.mig_mode:
            raise NvidiaSmiError(f"{refused}: MIG mode is not enabled")
        profile = next((p for p in gpu.geometry.profiles if str(p.profile_id) == profile_id), None)
        if profile is None:
            raise NvidiaSmiError(f"{refused}: Invalid Argument (no such profile)")
        start = int(start_text)
        if (start, profile.memory_slices) not in profile.placements:
            raise NvidiaSmiError(f"{refused} at placement {start}: Invalid Argument (placements {profile.starts})")
        problems = mig.layout_problems(gpu.geometry, [*gpu.layout(), (profile.name, start, profile.memory_slices)])
        if problems:
            raise NvidiaSmiError(f"{refused} at placement {start}: Insufficient Resources ({'; '.join(problems)})")
        gi_id = min(set(range(1, 15)) - set(gpu.instances))
        gpu.instances[gi_id] = FakeInstance(profile, start, {0: 0} if default_ci else {}, _uuid(gpu.index, gi_id))
        words = f"Successfully created GPU instance ID {gi_id} on GPU {gpu.index} using profile MIG {profile.name}"
        if default_ci:
            words += f"\nSuccessfully created compute instance ID 0 on GPU {gpu.index} GPU instance ID {gi_id}"
        return words

    def _destroy_compute(self, gpu: FakeGpu, gi_id: int) -> str:
        instance = gpu.instances[gi_id]
        if not instance.compute_instances:
            raise NvidiaSmiError(f"No compute instances found in GPU instance ID {gi_id} on GPU {gpu.index}")
        busy = [ci for ci, processes in instance.compute_instances.items() if processes]
        if busy:
            raise NvidiaSmiError(
                f"Unable to destroy compute instance ID {busy[0]} from GPU {gpu.index} GPU instance ID {gi_id}: "
                "In use by another client"
            )
        ids = sorted(instance.compute_instances)
        instance.compute_instances.clear()
        return "\n".join(
            f"Successfully destroyed compute instance ID {ci} from GPU {gpu.index} GPU instance ID {gi_id}"
            for ci in ids
        )

    def _destroy_gpu_instance(self, gpu: FakeGpu, gi_id: int) -> str:
        if gpu.instances[gi_id].compute_instances:
            raise NvidiaSmiError(
                f"Unable to destroy GPU instance ID {gi_id} from GPU {gpu.index}: In use by another client"
            )
        del gpu.instances[gi_id]
        return f"Successfully destroyed GPU instance ID {gi_id} from GPU {gpu.index}"

    def _list(self) -> str:
        lines = []
        for gpu in self.gpus.values():
            lines.append(f"GPU {gpu.index}: {gpu.geometry.model} (UUID: GPU-fake-{gpu.index})")
            for gi_id, instance in sorted(gpu.instances.items()):
                if instance.compute_instances:
                    lines.append(f"  MIG {instance.profile.name} Device {gi_id}: (UUID: {instance.uuid})")
        return "\n".join(lines)

    # -- parsing ------------------------------------------------------------------------------------------------

    def _gpu(self, options: dict) -> FakeGpu:
        try:
            return self.gpus[int(options["-i"])]
        except (KeyError, ValueError):
            raise NvidiaSmiError(f"No GPU {options.get('-i')!r} on this host") from None

    def _instance(self, gpu: FakeGpu, options: dict) -> int:
        try:
            gi_id = int(options["-gi"])
        except (KeyError, ValueError):
            raise NvidiaSmiError(f"Invalid GPU instance id {options.get('-gi')!r}") from None
        if gi_id not in gpu.instances:
            raise NvidiaSmiError(f"Unable to find GPU instance ID {gi_id} on GPU {gpu.index}: Not Found")
        return gi_id


def _options(args: list[str]) -> dict:
    """nvidia-smi's flags and their values, in any order: a flag followed by a word not starting with '-' takes
    it; -C, -dci and -dgi take none here."""
    options: dict = {}
    k = 0
    while k < len(args):
        flag = args[k]
        if flag in ("-C", "-dci", "-dgi") or k + 1 == len(args) or args[k + 1].startswith("-"):
            options[flag] = True
            k += 1
        else:
            options[flag] = args[k + 1]
            k += 2
    return options


def _uuid(gpu: int, gi_id: int) -> str:
    return f"MIG-{uuid.uuid5(uuid.NAMESPACE_URL, f'fake/{gpu}/{gi_id}')}"
