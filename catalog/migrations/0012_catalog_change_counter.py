# The change counter every catalog table bumps (config/versions.py): a process keeps the catalog it checks orders
# against (catalog/orderable.py) until it moves. A catalog table added later needs its own `counted` operation.

from django.db import migrations

from config.versions import counted, counter_table

CATALOG_TABLES = [
    "catalog_acceleratormodel",
    "catalog_baremetalprofile",
    "catalog_image",
    "catalog_image_compatible_vendors",
    "catalog_miggeometry",
    "catalog_migprofile",
    "catalog_resourcespec",
    "catalog_resourcespec_accelerator_models",
    "catalog_service",
    "catalog_service_bare_metal_profiles",
    "catalog_service_images",
    "catalog_service_serving_models",
    "catalog_service_specs",
    "catalog_service_visible_projects",
    "catalog_service_visible_tenants",
    "catalog_servingmodel",
    "catalog_servingmodel_templates",
    "catalog_servingtemplate",
    "catalog_sliceprofile",
    "catalog_vendor",
]


class Migration(migrations.Migration):
    dependencies = [("catalog", "0011_baremetalprofile_gpu_exporter")]

    operations = [counter_table(), counted("catalog", CATALOG_TABLES)]
