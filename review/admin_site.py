"""Django's admin for BatchDesk: open to people in the `admin` group (SPEC §8: user management is
theirs) without a staff flag set by hand. Staff outside that group keep what Django's own permissions
give them; catalogue owners and operators get nothing here."""

from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm

from .permissions import ADMIN, has_role


def may_use_the_admin(user) -> bool:
    return user.is_active and (user.is_staff or has_role(user, ADMIN))


class AdminLoginForm(AdminAuthenticationForm):
    def confirm_login_allowed(self, user) -> None:
        if not may_use_the_admin(user):
            super().confirm_login_allowed(user)  # refuses with Django's words


class BatchDeskAdminSite(admin.AdminSite):
    login_form = AdminLoginForm

    def has_permission(self, request) -> bool:
        return may_use_the_admin(request.user)
