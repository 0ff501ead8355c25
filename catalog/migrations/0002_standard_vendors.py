from django.db import migrations

STANDARD_VENDORS = [
    ("nvidia", "NVIDIA", "cuda"),
    ("amd", "AMD", "rocm"),
    ("huawei-ascend", "Huawei Ascend", "cann"),
    ("intel-gaudi", "Intel Gaudi", "synapse_ai"),
]


def create_vendors(apps, schema_editor):
    vendor_model = apps.get_model("catalog", "Vendor")
    for slug, name, stack in STANDARD_VENDORS:
        vendor_model.objects.get_or_create(slug=slug, defaults={"name": name, "software_stack": stack})


class Migration(migrations.Migration):
    dependencies = [("catalog", "0001_initial")]

    operations = [migrations.RunPython(create_vendors, migrations.RunPython.noop)]
