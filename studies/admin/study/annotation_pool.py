"""An annotation study on its study page: its setup (k, n, gold, realism), its pool of
conversations with where they came from, adding more from another study, and the paper's
annotation items in one click."""

from django.contrib import admin, messages
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils.html import format_html

from studies.admin.action_forms import AddConversationsForm
from studies.admin.permissions import identified, pages
from studies.annotation.items import add_paper_items
from studies.annotation.pool import Draw, add_people, add_simulated, add_training_samples
from studies.models import AnnotationSetup, RatedConversation, Study


class AnnotationSetupInline(admin.StackedInline):
    model = AnnotationSetup
    max_num = 1
    extra = 0
    verbose_name = "annotation setup (makes this an annotation study: raters rate conversations)"


def names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


class AnnotationPool:
    """StudyAdmin's annotation part: the pool column and its two pages."""

    @admin.display(description="Annotation pool")
    def annotation_pool(self, study):
        if not study.pk or not hasattr(study, "annotation"):
            return "- (a chat study; add an annotation setup below to make it one)"
        pool = study.rated_conversations
        people = pool.filter(source=RatedConversation.Source.PERSON, gold__isnull=True).count()
        simulated = pool.filter(source=RatedConversation.Source.SIMULATOR).count()
        return format_html(
            '{} people\'s, {} simulated, {} gold · <a href="{}">add conversations</a> '
            "(the paper's annotation items: the list's action)",
            people,
            simulated,
            pool.filter(gold__isnull=False).count(),
            reverse("admin:studies_study_add_conversations", args=[study.pk]),
        )

    def annotation_pages(self):
        return pages(
            self,
            (
                "<int:pk>/add-conversations/",
                self.add_conversations,
                "studies_study_add_conversations",
                "change",
            ),
        )

    def add_conversations(self, request, pk):
        study = get_object_or_404(Study, pk=pk, annotation__isnull=False)
        form = AddConversationsForm(request.POST or None)
        form.fields["origin"].queryset = form.fields["origin"].queryset.exclude(pk=study.pk)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            draw = Draw(
                arms=names(data["arms"]),
                success={"yes": True, "no": False}.get(data["success"]),
                min_user_turns=data["min_user_turns"],
                max_user_turns=data["max_user_turns"],
                since=data["since"],
                until=data["until"],
            )
            added = 0
            if data.get("samples_path"):
                added += add_training_samples(study, data["samples_path"], data["samples_as"], draw)
            elif data["people"]:
                added += add_people(study, data["origin"], draw)
            if data["simulated"] and not data.get("samples_path"):
                added += add_simulated(study, data["origin"], draw, names(data["simulators"]))
            self.message_user(request, f"{added} conversation(s) added.", messages.SUCCESS)
            return HttpResponseRedirect(reverse("admin:studies_study_change", args=[study.pk]))
        context = {
            **self.admin_site.each_context(request),
            "title": f"Add conversations to {study}",
            "form": form,
            "study": study,
            "opts": self.model._meta,
        }
        return render(request, "admin/studies/add_conversations.html", context)

    @admin.action(permissions=["change"], description="Use the paper's annotation items")
    def use_paper_annotation_items(self, request, queryset):
        for study in queryset:
            add_paper_items(study)
        self.message_user(
            request, f"The paper's annotation items are in {queryset.count()} questionnaire(s)."
        )


@admin.register(RatedConversation)
class RatedConversationAdmin(admin.ModelAdmin):
    """The pool with where each conversation came from: for researchers, never for raters.

    Under the participants rule: the origin conversation names its participant ("conversation
    of <Prolific id>"), so staff without the participants permission see it by number. The
    transcript stays readable to them: it is the redacted text that raters, strangers recruited
    on Prolific, read blind; what an ethics board guards here is the link from those words to the
    person, which is the participants permission's to give."""

    list_display = ["pk", "study", "source", "arm", "simulator", "is_gold", "ratings"]
    list_filter = ["study", "source"]
    fields = [
        "study",
        "source",
        "arm",
        "simulator",
        "origin_study",
        "origin_conversation",
        "origin_evaluation",
        "origin_sample",
        "gold",
        "transcript",
    ]
    readonly_fields = ["transcript", "origin_study", "origin_conversation", "origin_evaluation"]
    PSEUDONYMS = {"origin_conversation": "origin_conversation_number"}

    @admin.display(description="origin conversation")
    def origin_conversation_number(self, conversation):
        number = conversation.origin_conversation_id
        return (
            f"conversation #{number} (its participant: the participants permission)"
            if (number)
            else "-"
        )

    def get_fields(self, request, obj=None):
        return identified(request, super().get_fields(request, obj), self.PSEUDONYMS)

    def get_readonly_fields(self, request, obj=None):
        return identified(request, super().get_readonly_fields(request, obj), self.PSEUDONYMS)

    @admin.display(boolean=True, description="gold")
    def is_gold(self, conversation):
        return conversation.gold is not None

    @admin.display(description="rated by")
    def ratings(self, conversation):
        return conversation.assignments.filter(status="rated").count()
