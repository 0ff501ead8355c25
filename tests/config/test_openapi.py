from django.core.management import call_command


def test_openapi_schema_generates_and_validates_without_warnings(tmp_path):
    target = tmp_path / "schema.yml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(target))
    schema = target.read_text()
    for path in ("/api/v1/catalog/services/", "/api/v1/catalog/specs/", "/api/v1/projects/", "/api/v1/auth/token/"):
        assert path in schema
