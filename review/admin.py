"""People and the machine in Django's admin. People in the `admin` group manage people here (the site
itself lets them in: review/admin_site.py): they add users, deactivate them and give them the three
roles. What reaches the machine is a superuser's alone: superuser and staff status, permissions, the
roles' own permissions, and django-q's schedules and tasks (which run any function on a worker and
keep whatever it returned). The ledger's own models are `ledger/admin.py`, read-only."""

from django.contrib import admin
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User
from django_q.admin import FailAdmin, QueueAdmin, ScheduleAdmin, TaskAdmin
from django_q.models import Failure, OrmQ, Schedule, Success

from ledger.roles import ROLES

from .permissions import ADMIN, has_role


def holds_more_than_a_role(person: User) -> bool:
    """Superuser or staff status, a permission of their own, or a group that is not one of the roles:
    what only a superuser hands out, so only a superuser may change such an account (setting its
    password would hand all that over)."""
    return (
        person.is_superuser
        or person.is_staff
        or person.user_permissions.exists()
        or person.groups.exclude(name__in=ROLES).exists()
    )


class AdminRoleManagesPeople:
    """User management is the `admin` group's (SPEC §8), without per-model permissions granted by hand."""

    def has_module_permission(self, request) -> bool:
        return has_role(request.user, ADMIN) or super().has_module_permission(request)

    def has_view_permission(self, request, obj=None) -> bool:
        return has_role(request.user, ADMIN) or super().has_view_permission(request, obj)

    def has_add_permission(self, request) -> bool:
        return has_role(request.user, ADMIN) or super().has_add_permission(request)

    def has_change_permission(self, request, obj=None) -> bool:
        return has_role(request.user, ADMIN) or super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None) -> bool:
        return has_role(request.user, ADMIN) or super().has_delete_permission(request, obj)


class PeopleAdmin(AdminRoleManagesPeople, UserAdmin):
    """Everyone but a superuser sees a person's name, whether they may sign in, and their roles: never
    superuser or staff status or permissions (Django's own form would let anyone who may change users
    make themselves a superuser). A field left out of the form is ignored in a POST."""

    people_fieldsets = (
        (None, {"fields": ("username", "password")}),
        ("Personal info", {"fields": ("first_name", "last_name", "email")}),
        ("Access", {"fields": ("is_active", "groups")}),
        ("Important dates", {"fields": ("last_login", "date_joined")}),
    )

    def get_fieldsets(self, request, obj=None):
        if obj is None or request.user.is_superuser:
            return super().get_fieldsets(request, obj)
        return self.people_fieldsets

    def get_readonly_fields(self, request, obj=None):
        if request.user.is_superuser:
            return super().get_readonly_fields(request, obj)
        return ("last_login", "date_joined")

    def formfield_for_manytomany(self, db_field, request, **kwargs):
        if db_field.name == "groups" and not request.user.is_superuser:
            kwargs["queryset"] = Group.objects.filter(name__in=ROLES)
        return super().formfield_for_manytomany(db_field, request, **kwargs)

    def has_change_permission(self, request, obj=None) -> bool:
        if obj is not None and not request.user.is_superuser and holds_more_than_a_role(obj):
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None) -> bool:
        if obj is not None and not request.user.is_superuser and holds_more_than_a_role(obj):
            return False
        return super().has_delete_permission(request, obj)


class RoleAdmin(AdminRoleManagesPeople, GroupAdmin):
    """The roles and their permissions, to read: what a role may do is decided in the code and by a
    superuser, not by the people the roles are given to."""

    def has_add_permission(self, request) -> bool:
        return request.user.is_superuser

    def has_change_permission(self, request, obj=None) -> bool:
        return request.user.is_superuser

    def has_delete_permission(self, request, obj=None) -> bool:
        return request.user.is_superuser


class SuperusersOnly:
    """django-q's pages are the machine: a schedule or a resubmitted task runs any function on a
    worker, and a task's arguments and result hold whatever it was given and returned (an
    `os.getenv` would show a key). Nobody else sees them, whatever permissions they hold."""

    def has_module_permission(self, request) -> bool:
        return request.user.is_active and request.user.is_superuser

    def has_view_permission(self, request, obj=None) -> bool:
        return self.has_module_permission(request)

    def has_add_permission(self, request) -> bool:
        return self.has_module_permission(request) and super().has_add_permission(request)

    def has_change_permission(self, request, obj=None) -> bool:
        return self.has_module_permission(request)

    def has_delete_permission(self, request, obj=None) -> bool:
        return self.has_module_permission(request)


# django.contrib.auth registered Django's own; these are the same, for the `admin` group too.
admin.site.unregister([User, Group])
admin.site.register(User, PeopleAdmin)
admin.site.register(Group, RoleAdmin)


class MachineScheduleAdmin(SuperusersOnly, ScheduleAdmin):
    pass


class MachineSuccessAdmin(SuperusersOnly, TaskAdmin):
    pass


class MachineFailureAdmin(SuperusersOnly, FailAdmin):
    pass


class MachineQueueAdmin(SuperusersOnly, QueueAdmin):
    pass


# django_q registered its own (the queue's only with the database broker); the same, for superusers.
admin.site.unregister([Schedule, Success, Failure])
admin.site.register(Schedule, MachineScheduleAdmin)
admin.site.register(Success, MachineSuccessAdmin)
admin.site.register(Failure, MachineFailureAdmin)
if admin.site.is_registered(OrmQ):
    admin.site.unregister(OrmQ)
    admin.site.register(OrmQ, MachineQueueAdmin)
