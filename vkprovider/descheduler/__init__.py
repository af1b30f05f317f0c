"""The companion controller: overflow admission (out) and make-before-break move-back (in)."""
