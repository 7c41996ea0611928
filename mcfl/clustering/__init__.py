"""Clustering of clients as pure, jittable JAX functions on flat [n, d] matrices (clients as
rows): k-means (FeSEM), truncated SVD embeddings and MADC (FlexCFL), agglomerative linkage
(CFL, FL+HC, PACFL), trimmed k-means and robust per-cluster statistics (Robust)."""

from mcfl.clustering.distances import cosine_similarity, squared_distances
from mcfl.clustering.kmeans import (
    KMeansResult,
    kmeans,
    kmeans_plusplus,
    kmeans_plusplus_indices,
    lloyd,
)
from mcfl.clustering.linkage import agglomerative, complete_linkage
from mcfl.clustering.robust import masked_statistic, segment_statistic, trimmed_kmeans
from mcfl.clustering.svd import edc_embedding, madc, truncated_svd

__all__ = [
    "KMeansResult",
    "agglomerative",
    "complete_linkage",
    "cosine_similarity",
    "edc_embedding",
    "kmeans",
    "kmeans_plusplus",
    "kmeans_plusplus_indices",
    "lloyd",
    "madc",
    "masked_statistic",
    "segment_statistic",
    "trimmed_kmeans",
    "squared_distances",
    "truncated_svd",
]
