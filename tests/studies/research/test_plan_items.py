"""The frozen plan's item fields (studies/models/frozen_plan.py FROZEN_ITEM_FIELDS, what a
pre-registration holds fixed) and the admin's item fields (studies/admin/questionnaires.py
ItemInline.fields, what a researcher edits) are two lists on purpose: they differ, by the
fields named here. A new Item field, or one dropped from either list, fails here until someone
decides whether the plan freezes it and whether the admin shows it."""

from studies.admin.questionnaires import ItemInline
from studies.models import FROZEN_ITEM_FIELDS, Item

# edited in the admin, left free by the plan (no freeze refuses a change to them)
NOT_FROZEN = {
    "required": "whether a participant may skip the item: not among the fields frozen at the"
    " pre-registration (issue 14)",
    "identifying": "whether the retention period purges its free-text answers: a privacy"
    " setting, added after the freeze (issue 39)",
    "domain_input": "which answer the study's Domain reads from it: going live checks it"
    " against the task, not the plan",
}
# frozen, but not edited in the admin's item rows
NOT_IN_ADMIN = {
    "anchor_labels": "a label for every point, written by the questionnaire templates"
    " (studies/setup/questionnaires.py SEVEN_POINTS): frozen because participants saw them",
}


def item_fields() -> set[str]:
    return {f.name for f in Item._meta.concrete_fields} - {"id", "questionnaire"}


def test_every_item_field_is_frozen_or_named_free():
    assert set(FROZEN_ITEM_FIELDS).isdisjoint(NOT_FROZEN)
    assert set(FROZEN_ITEM_FIELDS) | set(NOT_FROZEN) == item_fields()


def test_the_admin_edits_the_frozen_fields_and_the_free_ones_but_those_named():
    assert set(NOT_IN_ADMIN) <= set(FROZEN_ITEM_FIELDS)
    assert set(ItemInline.fields) == (set(FROZEN_ITEM_FIELDS) - set(NOT_IN_ADMIN)) | set(NOT_FROZEN)
