from django.db.models import Prefetch
from rest_framework import viewsets

from tenancy.api.serializers import ProjectSerializer
from tenancy.models import Membership, Project
from tenancy.selectors import project_list_visible_to


class ProjectViewSet(viewsets.ReadOnlyModelViewSet):
    """Projects the caller may view, with the caller's role and the project's and tenant's quota limits."""

    serializer_class = ProjectSerializer
    filterset_fields = ["active", "tenant__slug"]
    search_fields = ["name", "slug", "cost_centre"]
    ordering_fields = ["name", "id"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation has no user
            return Project.objects.none()
        mine = Membership.objects.filter(user=self.request.user)
        return project_list_visible_to(user=self.request.user).prefetch_related(
            Prefetch("memberships", queryset=mine, to_attr="my_memberships")
        )
