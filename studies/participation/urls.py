from django.urls import path, re_path

from studies.participation import views

app_name = "studies"
# Tokens and slugs as any text: the views answer an unknown or malformed one with the friendly
# page (a converter that does not match would give Django's plain 404).
urlpatterns = [
    path("s/<str:slug>/", views.arrive, name="arrive"),
    path("p/<str:token>/", views.participant, name="participant"),
    path("p/<str:token>/consent/", views.consent, name="consent"),
    path("p/<str:token>/questionnaire/", views.questionnaire, name="questionnaire"),
    path("p/<str:token>/rate/", views.rate, name="rate"),
    path("p/<str:token>/done/", views.done, name="done"),
    path("p/<str:token>/stop/", views.stop, name="stop"),
    path("p/<str:token>/stop/data/", views.withdrawn_data, name="withdrawn-data"),
    # Prolific may post with or without the final slash (a POST cannot be redirected to it).
    re_path(r"^prolific/webhook/?$", views.prolific_webhook, name="prolific-webhook"),
]
