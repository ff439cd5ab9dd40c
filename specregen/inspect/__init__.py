"""The token inspector: one sample token by token, in the terminal (rich) or as an HTML page.

    specregen inspect TOKENS.parquet [--sample ID | --flag NAME | --status S] [--html OUT.html]

`view.build_view` turns a TokenSample into named, masked, part-labelled tokens and compares its
completion with the server's own ids; `terminal` and `html` render that one view model.
"""
