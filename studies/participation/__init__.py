"""The participant's path through a study, a module for each step: arrive (the Prolific link; a
newcomer's arm and scenario from assign), consent, start (the chat's conversation, or a rater's
conversations), chat_turn, questionnaire, complete. An annotation study's raters: rating.py;
stopping from inside the study: withdraw.py. They import one another one way only (arrive ->
assign; consent -> start -> assign; chat_turn -> start; questionnaire -> chat_turn, complete):
pyproject.toml's import-linter contracts refuse a cycle.

Views and the chat consumer stay thin and call these functions; every write happens in a
transaction so that nothing stored is lost or duplicated.
"""
