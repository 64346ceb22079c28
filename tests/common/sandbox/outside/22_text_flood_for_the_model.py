print(' a' * 65000)
# hands back the most text an execution may (the printed text when no image is named): a
# few bytes of code become ~65,000 tokens appended to the conversation, re-read by the
# model at every later step of the trajectory (~260,000 with the default 1 MiB output)
