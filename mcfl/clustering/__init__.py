"""Clustering of clients as pure, jittable JAX functions on flat [n, d] matrices (clients as
rows): k-means (FeSEM), truncated SVD embeddings and MADC (FlexCFL), complete linkage (CFL)."""

from mcfl.clustering.distances import cosine_similarity, squared_distances
from mcfl.clustering.kmeans import KMeansResult, kmeans, kmeans_plusplus, lloyd
from mcfl.clustering.linkage import complete_linkage
from mcfl.clustering.svd import edc_embedding, madc, truncated_svd

__all__ = [
    "KMeansResult",
    "complete_linkage",
    "cosine_similarity",
    "edc_embedding",
    "kmeans",
    "kmeans_plusplus",
    "lloyd",
    "madc",
    "squared_distances",
    "truncated_svd",
]
