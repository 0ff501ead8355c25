"""MIG geometry: NVIDIA's GPU-instance profiles and placements per card, the layout rules, and the host commands
that create and destroy instances. Pure Python (see scheduling/mig/__init__.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# ---------------------------------------------------------------------------------------------------- geometry


@dataclass(frozen=True)
class Profile:
    name: str
    profile_id: int
    compute: int  # compute slices
    memory_slices: int
    memory_gb: int
    placements: tuple[tuple[int, int], ...]  # (start memory slice, size)
    max_instances: int

    @property
    def starts(self) -> tuple[int, ...]:
        return tuple(start for start, _size in self.placements)

    @property
    def media_extensions(self) -> bool:
        """A ``+me`` profile takes the card's media engines (JPEG decoders, OFA): a card has one set of them."""
        return is_media_profile(self.name)


MEDIA_RULE = "a card has one set of media engines (JPEG/OFA): at most one +me instance of any size"


def is_media_profile(name: str) -> bool:
    return "+me" in name


def media_taken(counts: Mapping[str, int]) -> bool:
    """Whether a card with these instances per profile already holds a +me instance."""
    return any(n and is_media_profile(name) for name, n in counts.items())


@dataclass(frozen=True)
class Geometry:
    model: str
    compute_slices: int
    memory_slices: int
    profiles: tuple[Profile, ...]
    source: str = ""

    def profile(self, name: str) -> Profile | None:
        for profile in self.profiles:
            if profile.name == name:
                return profile
        return None

    @property
    def full_mask(self) -> int:
        return (1 << self.memory_slices) - 1


SOURCE = (
    "NVIDIA Multi-Instance GPU User Guide, 'Supported MIG Profiles' (docs.nvidia.com/datacenter/tesla/mig-user-guide,"
    " web edition r580, read 2026-12-01; PDF RN-08625-v2.0, March 2024); profile ids and placements as printed by "
    "nvidia-smi mig -lgip / -lgipp"
)


def _ampere_hopper(model: str, small: int, double: int, half: int, full: int, me: str = "+me") -> Geometry:
    """The 7-compute/8-memory-slice family (A100, H100, H200, B200): names follow each card's memory."""
    sizes = [
        (f"1g.{small}gb", 19, 1, 1, small, tuple((s, 1) for s in range(7)), 7),
        (f"1g.{small}gb{me}", 20, 1, 1, small, tuple((s, 1) for s in range(7)), 1),
        (f"1g.{double}gb", 15, 1, 2, double, tuple((s, 2) for s in (0, 2, 4, 6)), 4),
        (f"2g.{double}gb", 14, 2, 2, double, tuple((s, 2) for s in (0, 2, 4)), 3),
        (f"3g.{half}gb", 9, 3, 4, half, ((0, 4), (4, 4)), 2),
        (f"4g.{half}gb", 5, 4, 4, half, ((0, 4),), 1),
        (f"7g.{full}gb", 0, 7, 8, full, ((0, 8),), 1),
    ]
    return Geometry(model, 7, 8, tuple(Profile(*row) for row in sizes), SOURCE)


SEEDED: dict[str, Geometry] = {
    "A30 24GB": Geometry(
        "A30 24GB",
        4,
        4,
        (
            Profile("1g.6gb", 14, 1, 1, 6, ((0, 1), (1, 1), (2, 1), (3, 1)), 4),
            Profile("1g.6gb+me", 21, 1, 1, 6, ((0, 1), (1, 1), (2, 1), (3, 1)), 1),
            Profile("2g.12gb", 5, 2, 2, 12, ((0, 2), (2, 2)), 2),
            Profile("2g.12gb+me", 6, 2, 2, 12, ((0, 2), (2, 2)), 1),
            Profile("4g.24gb", 0, 4, 4, 24, ((0, 4),), 1),
        ),
        SOURCE,
    ),
    "A100 40GB": _ampere_hopper("A100 40GB", 5, 10, 20, 40),
    "A100 80GB": _ampere_hopper("A100 80GB", 10, 20, 40, 80),
    "H100 80GB": _ampere_hopper("H100 80GB", 10, 20, 40, 80),
    "H100 94GB": _ampere_hopper("H100 94GB", 12, 24, 47, 94),
    "H200 141GB": _ampere_hopper("H200 141GB", 18, 35, 71, 141),
    "B200 180GB": _ampere_hopper("B200 180GB", 23, 45, 90, 180),
}


def geometry_problems(geometry: Geometry) -> list[str]:
    """What makes a geometry impossible: placements outside the card, sizes that disagree with the profile,
    more compute than the card has, an instance limit the placements cannot reach."""
    problems = []
    if geometry.memory_slices < 1 or geometry.compute_slices < 1:
        problems.append("a card needs at least one compute and one memory slice")
    names = [profile.name for profile in geometry.profiles]
    if len(set(names)) != len(names):
        problems.append("profile names repeat")
    for profile in geometry.profiles:
        if not 1 <= profile.compute <= geometry.compute_slices:
            problems.append(f"{profile.name}: {profile.compute} compute slices, the card has {geometry.compute_slices}")
        if not profile.placements:
            problems.append(f"{profile.name}: no placement")
        for start, size in profile.placements:
            if size != profile.memory_slices:
                problems.append(
                    f"{profile.name}: placement at {start} has size {size}, the profile takes "
                    f"{profile.memory_slices} memory slices"
                )
            if start < 0 or start + size > geometry.memory_slices:
                problems.append(
                    f"{profile.name}: placement {start}+{size} is outside the card's "
                    f"{geometry.memory_slices} memory slices"
                )
        if profile.max_instances < 1:
            problems.append(f"{profile.name}: at most {profile.max_instances} instances")
        elif profile.media_extensions and profile.max_instances > 1:
            problems.append(f"{profile.name}: {profile.max_instances} instances, but {MEDIA_RULE}")
        elif profile.max_instances > max_pack(geometry, profile, 0, 0, {}):
            problems.append(f"{profile.name}: {profile.max_instances} instances cannot fit on one card")
    return problems


def layout_problems(geometry: Geometry, instances: Iterable[tuple[str, int, int]]) -> list[str]:
    """Why a layout (profile name, start, size per GPU instance) could not exist on the card; empty when it can."""
    problems = []
    occupied = 0
    compute = 0
    counts: dict[str, int] = {}
    for name, start, size in instances:
        profile = geometry.profile(name)
        if profile is None:
            problems.append(f"{name} is not a profile of {geometry.model}")
            continue
        if (start, size) not in profile.placements:
            problems.append(
                f"{name} cannot start at memory slice {start} with size {size} (starts {_or_list(profile.starts)})"
            )
            continue
        mask = ((1 << size) - 1) << start
        if occupied & mask:
            problems.append(f"{name} at {start} overlaps memory slices {_ranges(occupied & mask)}")
        if profile.media_extensions and media_taken(counts):
            problems.append(f"{name} at {start}: {MEDIA_RULE}")
        occupied |= mask
        compute += profile.compute
        counts[name] = counts.get(name, 0) + 1
        if counts[name] > profile.max_instances:
            problems.append(f"more than {profile.max_instances} {name}")
    if compute > geometry.compute_slices:
        problems.append(f"{compute} compute slices used, the card has {geometry.compute_slices}")
    return problems


def fits_somehow(geometry: Geometry, names: Sequence[str]) -> bool:
    """Whether some layout holds all these profiles at once (exhaustive, largest first): the milli-share model's
    layouts are checked with it."""
    profiles = []
    for name in names:
        profile = geometry.profile(name)
        if profile is None:
            return False
        profiles.append(profile)
    if sum(p.compute for p in profiles) > geometry.compute_slices:
        return False
    counts: dict[str, int] = {}
    for p in profiles:
        counts[p.name] = counts.get(p.name, 0) + 1
        if counts[p.name] > p.max_instances:
            return False
    if sum(n for name, n in counts.items() if is_media_profile(name)) > 1:
        return False
    profiles.sort(key=lambda p: (-p.memory_slices, p.name))

    def search(k: int, occupied: int) -> bool:
        if k == len(profiles):
            return True
        for start, size in profiles[k].placements:
            mask = ((1 << size) - 1) << start
            if not occupied & mask and search(k + 1, occupied | mask):
                return True
        return False

    return search(0, 0)


def idle_in_the_way(
    geometry: Geometry,
    held: Sequence[tuple[str, int, int]],
    idle: Sequence,
    new: tuple[str, int, int],
) -> list:
    """The idle instances (objects with ``profile``, ``start``, ``size``) a host must destroy before it can create
    ``new`` on a card that also holds ``held``: every one whose memory slices the new one overlaps, then, while the
    card would still refuse the new one (its compute slices, a profile's instance limit, the one set of media
    engines), more of them: the same profile first, then from the highest memory slice down."""
    new_mask = ((1 << new[2]) - 1) << new[1]
    doomed = [i for i in idle if (((1 << i.size) - 1) << i.start) & new_mask]
    kept = [i for i in idle if i not in doomed]
    new_profile = geometry.profile(new[0])
    for instance in sorted(kept, key=lambda i: (i.profile != new[0] and not _both_media(i, new_profile), -i.start)):
        if not layout_problems(geometry, [*held, *((i.profile, i.start, i.size) for i in kept), new]):
            break
        kept.remove(instance)
        doomed.append(instance)
    return doomed


def _both_media(instance, profile: Profile | None) -> bool:
    return profile is not None and profile.media_extensions and is_media_profile(instance.profile)


def max_pack(geometry: Geometry, profile: Profile, occupied: int, compute_used: int, counts: Mapping[str, int]) -> int:
    """Most instances of ``profile`` that fit at once in the free slices. All placements of a profile have one
    size, so taking free placements in start order (earliest end first) is optimal."""
    n = 0
    taken = occupied
    for start, size in profile.placements:
        mask = ((1 << size) - 1) << start
        if not taken & mask:
            taken |= mask
            n += 1
    room = (geometry.compute_slices - compute_used) // profile.compute
    limit = 1 - media_taken(counts) if profile.media_extensions else profile.max_instances - counts.get(profile.name, 0)
    return max(0, min(n, room, limit))


def free_starts(geometry: Geometry, profile: Profile, occupied: int, compute_used: int, counts) -> list[int]:
    if compute_used + profile.compute > geometry.compute_slices:
        return []
    if counts.get(profile.name, 0) >= profile.max_instances:
        return []
    if profile.media_extensions and media_taken(counts):
        return []
    return [start for start, size in profile.placements if not occupied & (((1 << size) - 1) << start)]


def _ranges(mask: int) -> str:
    """Memory slices of a mask as text: "1–3 and 6" (an en dash, as people write ranges)."""  # noqa: RUF002
    slices = [i for i in range(mask.bit_length()) if mask >> i & 1]
    runs: list[str] = []
    i = 0
    while i < len(slices):
        j = i
        while j + 1 < len(slices) and slices[j + 1] == slices[j] + 1:
            j += 1
        runs.append(str(slices[i]) if i == j else f"{slices[i]}–{slices[j]}")  # noqa: RUF001
        i = j + 1
    return _and_list(runs) or "none"


def _and_list(items: Sequence[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1] if items else ""


def _or_list(items: Iterable[int]) -> str:
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def host_commands(
    gpu: int,
    *,
    destroy: Iterable[int | None] = (),
    mode: str | None = None,
    create: tuple[int, int] | None = None,
) -> list[list[str]]:
    """What a host runs on one card before work starts there, in order: destroy the idle GPU instances in the way
    (by GPU instance id: their compute instances, then the instance), change the card's mode ("mig" or "whole",
    only on a card without instances), then create the new instance (``(profile id, start)``)."""
    commands = [command for gi_id in destroy for command in destroy_commands(gpu, gi_id)]
    if mode is not None:
        commands.append(["nvidia-smi", "-i", str(gpu), "-mig", "1" if mode == "mig" else "0"])
    if create is not None:
        commands += create_commands(gpu, *create)
    return commands


def create_commands(gpu: int, profile_id: int, start: int) -> list[list[str]]:
    """The host commands that create one GPU instance (and its default compute instance) at a placement.
    `nvidia-smi mig -lgipp` lists a profile's placements; `-cgi <profile id>:<start>` asks for one (R525 and later
    drivers)."""
    return [
        ["nvidia-smi", "mig", "-i", str(gpu), "-cgi", f"{profile_id}:{start}", "-C"],
        ["nvidia-smi", "-L"],  # reads the new MIG device UUID back
    ]


def destroy_commands(gpu: int, gi_id: int | None) -> list[list[str]]:
    """Destroy a GPU instance: its compute instances, then the GPU instance."""
    gi = "?" if gi_id is None else str(gi_id)
    return [
        ["nvidia-smi", "mig", "-i", str(gpu), "-gi", gi, "-dci"],
        ["nvidia-smi", "mig", "-i", str(gpu), "-dgi", "-gi", gi],
    ]
