"""Seed NVIDIA's MIG geometry for A30 24GB, A100 40GB/80GB, H100 80GB/94GB, H200 141GB and B200 180GB.

Source: NVIDIA Multi-Instance GPU User Guide, "Supported MIG Profiles"
(docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html, web edition r580, read 2026-12-01;
PDF RN-08625-v2.0, March 2024). Profile ids and placements as `nvidia-smi mig -lgip` / `-lgipp` print them: on the
7-compute/8-memory-slice cards 1g starts 0..6 (size 1), the double-memory 1g at 0, 2, 4, 6 (size 2), 2g at 0, 2, 4
(size 2), 3g at 0, 4 (size 4), 4g at 0 (size 4), 7g at 0 (size 8); on A30 1g at 0..3, 2g at 0, 2, 4g at 0.
The data is frozen here (a migration must not change with the code); tests check it equals scheduling.mig.SEEDED.
"""

from django.db import migrations

SOURCE = (
    "NVIDIA Multi-Instance GPU User Guide, 'Supported MIG Profiles' (docs.nvidia.com/datacenter/tesla/mig-user-guide,"
    " web edition r580, read 2026-12-01; PDF RN-08625-v2.0, March 2024); profile ids and placements as printed by "
    "nvidia-smi mig -lgip / -lgipp"
)


def _family(small, double, half, full):
    ones = [[s, 1] for s in range(7)]
    return [
        (f"1g.{small}gb", 19, 1, 1, small, 7, ones),
        (f"1g.{small}gb+me", 20, 1, 1, small, 1, ones),
        (f"1g.{double}gb", 15, 1, 2, double, 4, [[0, 2], [2, 2], [4, 2], [6, 2]]),
        (f"2g.{double}gb", 14, 2, 2, double, 3, [[0, 2], [2, 2], [4, 2]]),
        (f"3g.{half}gb", 9, 3, 4, half, 2, [[0, 4], [4, 4]]),
        (f"4g.{half}gb", 5, 4, 4, half, 1, [[0, 4]]),
        (f"7g.{full}gb", 0, 7, 8, full, 1, [[0, 8]]),
    ]


GEOMETRIES = {
    # name: (compute slices, memory slices, [(profile, id, compute, memory slices, GB, max instances, placements)])
    "A30 24GB": (
        4,
        4,
        [
            ("1g.6gb", 14, 1, 1, 6, 4, [[0, 1], [1, 1], [2, 1], [3, 1]]),
            ("1g.6gb+me", 21, 1, 1, 6, 1, [[0, 1], [1, 1], [2, 1], [3, 1]]),
            ("2g.12gb", 5, 2, 2, 12, 2, [[0, 2], [2, 2]]),
            ("2g.12gb+me", 6, 2, 2, 12, 1, [[0, 2], [2, 2]]),
            ("4g.24gb", 0, 4, 4, 24, 1, [[0, 4]]),
        ],
    ),
    "A100 40GB": (7, 8, _family(5, 10, 20, 40)),
    "A100 80GB": (7, 8, _family(10, 20, 40, 80)),
    "H100 80GB": (7, 8, _family(10, 20, 40, 80)),
    "H100 94GB": (7, 8, _family(12, 24, 47, 94)),
    "H200 141GB": (7, 8, _family(18, 35, 71, 141)),
    "B200 180GB": (7, 8, _family(23, 45, 90, 180)),
}


def seed(apps, schema_editor):
    MigGeometry = apps.get_model("catalog", "MigGeometry")
    MigProfile = apps.get_model("catalog", "MigProfile")
    for name, (compute, memory, profiles) in GEOMETRIES.items():
        geometry, _ = MigGeometry.objects.update_or_create(
            name=name, defaults={"compute_slices": compute, "memory_slices": memory, "source": SOURCE}
        )
        for profile, profile_id, slices, memory_slices, gb, most, placements in profiles:
            MigProfile.objects.update_or_create(
                geometry=geometry,
                name=profile,
                defaults={
                    "profile_id": profile_id,
                    "compute_slices": slices,
                    "memory_slices": memory_slices,
                    "memory_gb": gb,
                    "max_instances": most,
                    "placements": placements,
                },
            )


def unseed(apps, schema_editor):
    apps.get_model("catalog", "MigGeometry").objects.filter(name__in=GEOMETRIES).delete()


class Migration(migrations.Migration):
    dependencies = [("catalog", "0007_mig_geometry")]
    operations = [migrations.RunPython(seed, unseed)]
