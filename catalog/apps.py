from django.apps import AppConfig

_OPERATED_MODELS = [
    "vendor",
    "acceleratormodel",
    "sliceprofile",
    "miggeometry",
    "migprofile",
    "resourcespec",
    "image",
    "baremetalprofile",
    "servingtemplate",
    "servingmodel",
    "service",
]


class CatalogConfig(AppConfig):
    name = "catalog"
    verbose_name = "Catalog"
    # Catalog entries are retired (deprecated, withdrawn, closed), never deleted: history refers to them.
    operator_permissions = [
        f"catalog.{verb}_{model}" for model in _OPERATED_MODELS for verb in ("view", "add", "change")
    ]
