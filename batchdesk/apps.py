from django.contrib.admin.apps import AdminConfig


class BatchDeskAdminConfig(AdminConfig):
    """Django's admin with BatchDesk's site: people in the `admin` group get in without a staff flag."""

    default_site = "review.admin_site.BatchDeskAdminSite"
