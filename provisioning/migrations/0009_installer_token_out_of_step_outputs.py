"""The installer's token leaves the step outputs: a PXE boot step recorded the script URL with the token in its path,
which every viewer of the request could read. Those URLs lose the token (the script is now served by the server's
address at one fixed URL), and a run still waiting for such an installer loses its token too: whoever read it could
otherwise still report for it. That install cannot report any more; its wait times out and an operator retries."""

import re

from django.db import migrations, models

TOKEN_IN_PATH = re.compile(r"/pxe/[^/]+/boot\.ipxe$")


def forget_exposed_tokens(apps, schema_editor):
    Step = apps.get_model("provisioning", "ProvisioningStep")
    Run = apps.get_model("provisioning", "ProvisioningRun")
    exposed = Step.objects.filter(name="boot_installer", output__has_key="script")
    for step in exposed:
        step.output["script"] = TOKEN_IN_PATH.sub("/pxe/boot.ipxe", step.output["script"])
        step.save(update_fields=["output"])
    Run.objects.filter(pk__in=exposed.values("run_id"), installer_reported_at__isnull=True).update(
        installer_token_hash=""
    )


class Migration(migrations.Migration):
    dependencies = [
        ("provisioning", "0008_connect_secrets_out_of_outputs"),
    ]

    operations = [
        migrations.AddField(
            model_name="provisioningrun",
            name="installer_token_nonce",
            field=models.CharField(blank=True, max_length=32),
        ),
        migrations.RunPython(forget_exposed_tokens, migrations.RunPython.noop),
    ]
