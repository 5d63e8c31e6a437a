from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from studies.rehearsal.demo_studies import seed_demo_study, seed_domain_studies


class Command(BaseCommand):
    help = "Create (or refresh) the demo studies and the demo admin user; print their details."

    def add_arguments(self, parser):
        parser.add_argument(
            "--engine-url", default=None, help="OpenAI-compatible base URL for the arms."
        )
        parser.add_argument(
            "--admin-user", default=settings.PARLEY_ADMIN_USER, help="The demo admin's username."
        )
        parser.add_argument(
            "--admin-password",
            default=settings.PARLEY_ADMIN_PASSWORD,
            help="The demo admin's password (default: the PARLEY_ADMIN_PASSWORD setting).",
        )

    def handle(self, *args, **options):
        username, password = options["admin_user"], options["admin_password"]
        if not password:
            raise CommandError("give --admin-password or set PARLEY_ADMIN_PASSWORD")
        study = seed_demo_study(options["engine_url"])
        for trained in seed_domain_studies(options["engine_url"]):
            arms = ",".join(trained.arms.values_list("name", flat=True))
            self.stdout.write(f"study={trained.slug} arms={arms}")
        User = get_user_model()
        user, _ = User.objects.get_or_create(username=username, defaults={"email": ""})
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        self.stdout.write(
            f"study={study.slug} arms={','.join(study.arms.values_list('name', flat=True))}"
        )
        self.stdout.write(f"admin_user={username}")
