"""The mail that tells a project's lead the directory took someone out of their project."""

from config.hooks import ask
from config.mail import Mail, mails_send
from tenancy import hooks
from tenancy.models import Project, User


def lead_told_of_removal(*, project_id: int, user_id: int) -> int:
    """Mail the lead who left, and which of their requests stay open and running under the project; 0 when there is
    nobody to tell (the project or the person is gone, or the lead has no address)."""
    project = Project.objects.select_related("lead").filter(pk=project_id).first()
    person = User.objects.filter(pk=user_id).first()
    if project is None or person is None:
        return 0
    open_work = ask(hooks.OPEN_WORK, project_id, user_id) or []
    return mails_send(
        [
            Mail(
                to=project.lead.email,
                subject=f"{person.username} left {project.name}",
                template="tenancy/mail/directory_removal",
                context={"lead": project.lead, "person": person, "project": project, "open_work": open_work},
            )
        ]
    )
