"""Issue 37 item 7: an image's text fields reach batch scripts, command lines and logs, so none may hold a line
break or another control character (a newline in a reference ran a command on a Slurm node): refused by the
operator console's form and by the database, whoever writes."""

import pytest
from django.db import IntegrityError, transaction

from catalog.models import IMAGE_TEXT_FIELDS, Image
from tests import factories

pytestmark = pytest.mark.django_db

INJECTED = "registry.test/img:1\ntouch /tmp/owned #"


def _image_post(**fields) -> dict:
    values = {
        "name": "workspace",
        "version": "1",
        "reference": "registry.test/workspace:1",
        "os": "Debian 12",
        "runtime": "cuda",
        "configuration": "{}",
        "compatible_vendors": [factories.vendor("nvidia").pk],
        "approved": "on",
        "change_reason": "New image",
    }
    return {**values, **fields}


@pytest.mark.parametrize("value", [INJECTED, "img\r1", "img\x1b[31m", "a\tb"])
def test_the_console_refuses_an_image_whose_reference_holds_a_control_character(console, value):
    response = console.post("/admin/catalog/image/add/", _image_post(reference=value))

    assert response.status_code == 200
    assert response.context["adminform"].form.errors["reference"] == [
        "Must not contain a line break or other control character."
    ]
    assert not Image.objects.exists()


def test_the_console_still_takes_a_plain_image(console):
    response = console.post("/admin/catalog/image/add/", _image_post())

    assert response.status_code == 302, response.context["adminform"].form.errors
    assert Image.objects.get().reference == "registry.test/workspace:1"


@pytest.mark.parametrize("field", IMAGE_TEXT_FIELDS)
def test_the_database_refuses_a_control_character_in_any_text_field_of_an_image(field):
    image = factories.ImageFactory()
    setattr(image, field, "x\ny")

    with pytest.raises(IntegrityError, match="image_text_without_control_characters"), transaction.atomic():
        image.save()
