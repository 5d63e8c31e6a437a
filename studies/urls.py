from django.urls import path, re_path

from . import views

app_name = "studies"
urlpatterns = [
    path("s/<slug:slug>/", views.arrive, name="arrive"),
    path("p/<uuid:token>/", views.participant, name="participant"),
    path("p/<uuid:token>/consent/", views.consent, name="consent"),
    path("p/<uuid:token>/questionnaire/", views.questionnaire, name="questionnaire"),
    path("p/<uuid:token>/done/", views.done, name="done"),
    # Prolific may post with or without the final slash (a POST cannot be redirected to it).
    re_path(r"^prolific/webhook/?$", views.prolific_webhook, name="prolific-webhook"),
]
