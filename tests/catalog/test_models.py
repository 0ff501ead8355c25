"""Catalog models: database constraints, model validation and the derived quantities used by quota."""

from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from catalog.choices import AcceleratorKind, Runtime, SpecStatus
from catalog.models import AcceleratorModel, Vendor
from tests.factories import (
    AcceleratorModelFactory,
    BareMetalProfileFactory,
    ImageFactory,
    ResourceSpecFactory,
    ServiceFactory,
    ServingTemplateFactory,
    SliceProfileFactory,
    vendor,
)

pytestmark = pytest.mark.django_db


def _violates_constraint(factory, **fields):
    with pytest.raises(IntegrityError) as raised, transaction.atomic():
        factory(**fields)
    return str(raised.value)


# --- database constraints -------------------------------------------------------------------------------


def test_spec_needs_at_least_one_accelerator():
    assert "spec_count_positive" in _violates_constraint(ResourceSpecFactory, accelerator_count=0)


def test_spec_price_cannot_be_negative():
    message = _violates_constraint(ResourceSpecFactory, hourly_price=Decimal("-0.01"))
    assert "spec_price_non_negative" in message


def test_spec_price_zero_is_allowed():
    assert ResourceSpecFactory(hourly_price=Decimal(0)).pk is not None


def test_deprecated_spec_needs_a_deprecation_time():
    message = _violates_constraint(ResourceSpecFactory, status=SpecStatus.DEPRECATED, deprecated_at=None)
    assert "spec_deprecated_at_matches_status" in message


def test_active_spec_cannot_carry_a_deprecation_time():
    message = _violates_constraint(ResourceSpecFactory, status=SpecStatus.ACTIVE, deprecated_at=timezone.now())
    assert "spec_deprecated_at_matches_status" in message


def test_deprecated_spec_with_time_is_allowed():
    spec = ResourceSpecFactory(status=SpecStatus.DEPRECATED, deprecated_at=timezone.now())
    assert spec.status == SpecStatus.DEPRECATED


@pytest.mark.parametrize("fraction", [Decimal(0), Decimal("1.0001"), Decimal("-0.5")])
def test_slice_fraction_must_be_in_zero_one(fraction):
    assert "slice_fraction_in_0_1" in _violates_constraint(SliceProfileFactory, compute_fraction=fraction)


@pytest.mark.parametrize("fraction", [Decimal("0.0001"), Decimal(1)])
def test_slice_fraction_bounds_are_inclusive_of_one(fraction):
    assert SliceProfileFactory(compute_fraction=fraction).compute_fraction == fraction


def test_slice_name_unique_per_accelerator():
    accelerator = AcceleratorModelFactory()
    SliceProfileFactory(accelerator=accelerator, name="1g.10gb")
    message = _violates_constraint(SliceProfileFactory, accelerator=accelerator, name="1g.10gb")
    assert "slice_profile_unique_per_model" in message


def test_same_slice_name_on_another_accelerator_is_fine():
    SliceProfileFactory(name="1g.10gb")
    assert SliceProfileFactory(name="1g.10gb").pk is not None


def test_template_max_tokens_within_context_length():
    message = _violates_constraint(ServingTemplateFactory, context_length=4096, max_tokens=4097)
    assert "template_max_tokens_within_context" in message


def test_template_max_tokens_equal_to_context_is_allowed():
    assert ServingTemplateFactory(context_length=4096, max_tokens=4096).pk is not None


def test_service_default_duration_within_max():
    message = _violates_constraint(ServiceFactory, default_duration_hours=200, max_duration_hours=168)
    assert "service_default_duration_within_max" in message


# --- model validation (full_clean) ----------------------------------------------------------------------


def test_slice_cannot_have_more_memory_than_its_card():
    profile = SliceProfileFactory.build(accelerator=AcceleratorModelFactory(memory_gb=80), memory_gb=81)
    with pytest.raises(ValidationError) as raised:
        profile.full_clean()
    assert "memory_gb" in raised.value.message_dict


def test_slice_with_all_of_the_card_memory_is_valid():
    SliceProfileFactory.build(accelerator=AcceleratorModelFactory(memory_gb=80), memory_gb=80).full_clean()


def test_spec_cannot_ask_for_more_slices_than_fit_on_a_card():
    profile = SliceProfileFactory(max_per_device=3)
    spec = ResourceSpecFactory.build(slice_profile=profile, accelerator_count=4)
    with pytest.raises(ValidationError) as raised:
        spec.full_clean()
    assert "accelerator_count" in raised.value.message_dict


def test_spec_with_max_slices_per_card_is_valid():
    profile = SliceProfileFactory(max_per_device=3)
    ResourceSpecFactory.build(slice_profile=profile, accelerator_count=3).full_clean()


def _profile(**fields):
    accelerator = fields.pop("accelerator_model", None) or AcceleratorModelFactory(vendor=vendor("nvidia"))
    image = fields.pop("os_image", None) or ImageFactory(compatible_vendors=[accelerator.vendor])
    return BareMetalProfileFactory.build(accelerator_model=accelerator, os_image=image, **fields)


def test_bare_metal_profile_valid():
    _profile(validation_suite=["bmc_reachable", "collective_bandwidth"]).full_clean()


@pytest.mark.parametrize("suite", [["bmc_reachable", "smoke_test"], "bmc_reachable", {"bmc_reachable": True}])
def test_bare_metal_profile_rejects_unknown_validation_checks(suite):
    with pytest.raises(ValidationError) as raised:
        _profile(validation_suite=suite).full_clean()
    assert "validation_suite" in raised.value.message_dict


def test_bare_metal_image_must_support_the_accelerator_vendor():
    accelerator = AcceleratorModelFactory(vendor=vendor("nvidia"))
    rocm_image = ImageFactory(runtime=Runtime.ROCM, compatible_vendors=[vendor("amd")])
    with pytest.raises(ValidationError) as raised:
        _profile(accelerator_model=accelerator, os_image=rocm_image).full_clean()
    assert "os_image" in raised.value.message_dict


# --- derived quantities ---------------------------------------------------------------------------------


def test_gpu_equivalents_of_whole_cards_is_the_count():
    assert ResourceSpecFactory(accelerator_count=4).gpu_equivalents == Decimal(4)


def test_gpu_equivalents_of_slices_is_fraction_times_count():
    profile = SliceProfileFactory(compute_fraction=Decimal("0.1429"), max_per_device=7)
    spec = ResourceSpecFactory(slice_profile=profile, accelerator_count=3, accelerator_models=[profile.accelerator])
    assert spec.gpu_equivalents == Decimal("0.4287")


def test_accelerator_memory_uses_smallest_compatible_card():
    small, large = AcceleratorModelFactory(memory_gb=40), AcceleratorModelFactory(memory_gb=48)
    spec = ResourceSpecFactory(accelerator_count=2, accelerator_models=[large, small])
    assert spec.accelerator_memory_gb == 80


def test_accelerator_memory_of_slices_is_slice_memory_times_count():
    profile = SliceProfileFactory(memory_gb=10, max_per_device=7)
    spec = ResourceSpecFactory(slice_profile=profile, accelerator_count=3, accelerator_models=[profile.accelerator])
    assert spec.accelerator_memory_gb == 30


def test_spec_is_slice_flag():
    profile = SliceProfileFactory()
    assert ResourceSpecFactory(slice_profile=profile, accelerator_models=[profile.accelerator]).is_slice
    assert not ResourceSpecFactory().is_slice


# --- reference data -------------------------------------------------------------------------------------


def test_standard_vendors_exist_after_migrations():
    stacks = dict(Vendor.objects.values_list("slug", "software_stack"))
    assert stacks == {"nvidia": "cuda", "amd": "rocm", "huawei-ascend": "cann", "intel-gaudi": "synapse_ai"}


def test_accelerator_str_names_the_vendor_once():
    model = AcceleratorModelFactory(vendor=vendor("huawei-ascend"), name="Ascend 910B", kind=AcceleratorKind.NPU)
    assert str(AcceleratorModel.objects.get(pk=model.pk)) == "Huawei Ascend 910B"
    other = AcceleratorModelFactory(vendor=vendor("nvidia"), name="H100 80GB SXM")
    assert str(AcceleratorModel.objects.get(pk=other.pk)) == "NVIDIA H100 80GB SXM"
