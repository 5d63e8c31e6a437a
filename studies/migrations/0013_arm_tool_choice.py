from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("studies", "0012_simulator_evaluations"),
    ]

    operations = [
        migrations.AddField(
            model_name="arm",
            name="tool_choice",
            field=models.CharField(
                choices=[
                    ("auto", "The agent decides at every step"),
                    ("first", "Each reply starts with a tool call, then the agent decides"),
                    (
                        "required",
                        "Tool calls until the Domain's per-reply budget is spent, then text",
                    ),
                ],
                default="auto",
                help_text="How the agent is asked to use the Domain's tools in each reply. A small model left to decide (e.g. SmolLM2) seldom calls one; 'first' and 'required' make the engine write a call (tool format 'structured' or 'native'). Ignored in a Domain without tools.",
                max_length=10,
            ),
        ),
    ]
