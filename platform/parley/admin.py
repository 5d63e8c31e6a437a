"""The one Checkpoint admin, composed here at the top, where every app is known: agents'
registry (which also registers itself, for agents installed alone), training's run column and
studies' attach action. Before, each app extended whatever the last had registered, so the
admin a researcher got depended on the order of INSTALLED_APPS."""

from django.contrib import admin

from agents.admin import CheckpointAdmin
from agents.models import Checkpoint
from studies.admin.checkpoints import AttachToArms
from training.admin import TrainingRunColumn


class ProjectCheckpointAdmin(AttachToArms, TrainingRunColumn, CheckpointAdmin):
    actions = ["attach_to_arm"]


if admin.site.is_registered(Checkpoint):  # agents' own, whichever app's admin loaded first
    admin.site.unregister(Checkpoint)
admin.site.register(Checkpoint, ProjectCheckpointAdmin)
