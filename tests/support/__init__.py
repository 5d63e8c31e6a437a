"""What tests share: helpers, stand-in servers and their data, imported from here (never from a
conftest or another test module). Fixtures stay in the conftest files, which import from here."""
