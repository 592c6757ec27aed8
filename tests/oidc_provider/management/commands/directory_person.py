from django.contrib.auth.models import Group, User
from django.core.management import BaseCommand


class Command(BaseCommand):
    help = "Adds a person to the directory or changes one: password, e-mail, name, groups."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--password")
        parser.add_argument("--email")
        parser.add_argument("--groups", help="comma-separated; empty: in no group")
        parser.add_argument("--rename-to")

    def handle(self, *args, username, password, email, groups, rename_to, **options):
        person, _ = User.objects.get_or_create(username=username)
        if password is not None:
            person.set_password(password)
        if email is not None:
            person.email = email
        if rename_to:
            person.username = rename_to
        person.save()
        if groups is not None:
            names = [name for name in groups.split(",") if name]
            person.groups.set([Group.objects.get_or_create(name=name)[0] for name in names])
