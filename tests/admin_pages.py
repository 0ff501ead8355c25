"""Helpers for tests that post admin pages the way a browser does."""


def as_posted(page) -> dict:
    """A change page's form and inline forms with their current values, as the browser posts them unedited."""
    formsets = [inline.formset for inline in page.context["inline_admin_formsets"]]
    return _posted(
        [
            page.context["adminform"].form,
            *(form for formset in formsets for form in (formset.management_form, *formset.forms)),
        ]
    )


def changelist_as_posted(page) -> dict:
    """A changelist's editable columns with their current values, as the browser posts them unedited."""
    formset = page.context["cl"].formset
    return _posted([formset.management_form, *formset.forms])


def _posted(forms) -> dict:
    data = {}
    for form in forms:
        for name, field in form.fields.items():
            value = form.initial.get(name, field.initial)
            if value is True:
                data[form.add_prefix(name)] = "on"
            elif isinstance(value, list):
                data[form.add_prefix(name)] = [getattr(item, "pk", item) for item in value]
            elif value is not None and value is not False:  # 0 is a value (INITIAL_FORMS of an empty formset)
                data[form.add_prefix(name)] = getattr(value, "pk", value)
    return data
