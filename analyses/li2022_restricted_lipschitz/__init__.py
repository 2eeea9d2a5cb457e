"""Li et al. 2022, "When Does Differentially Private Learning Not Suffer in High Dimensions?"

``text``: the text experiment (§4.2 Fig. 2a/2b, App. B, Theorems 3.3/3.5 on the measured G_k).
"""
