"""Hadamard matrices of the orders that are not powers of two: m = 12, 20, 28, 36, 40, 44, 52, 60, 108,
140, 148, 156, 172 (QuaRot's list, and 148 for Qwen2's 18944 = 148 x 128), built here from their
definitions, once, and cached.

Constructions (each checked by tests/hadamard/test_hadamard_orders.py: H H^T = m I, entries +-1):

* Paley I, q = m - 1 a prime power = 3 (mod 4): the Jacobsthal matrix Q[i, j] = chi(e_j - e_i) (chi the
  quadratic character of GF(q)) is skew, and H = I + [[0, 1^T], [-1, Q]] is Hadamard. Here it is taken
  in a symmetric form: with P the permutation e -> -e of GF(q), C = (Q + I) P has C[i, j] =
  [e_i + e_j = 0] - chi(e_i + e_j) (symmetric), and H = [[-1, 1^T], [1, C]] (the same matrix, times
  diag(1, P), its first column negated). m = 12, 20, 28 (GF(27)), 44, 60, 108, 140.
* Paley II, q = m / 2 - 1 a prime power = 1 (mod 4): Q is symmetric; with S = [[0, 1^T], [1, Q]],
  H = I (x) [[1, -1], [-1, -1]] + S (x) [[1, 1], [1, -1]] (symmetric). m = 36, 52 (GF(25)), 148.
* Sylvester doubling: H_2m = H_m (x) H_2 (each entry h becomes [[h, h], [h, -h]]). m = 40 = 20 x 2, so
  that H_40 (x) H_2^k is H_20 (x) H_2^(k+1): a width 40 x 2^k is the same transform as 20 x 2^(k+1).
* Williamson, m = 4 w: four symmetric circulant +-1 matrices A, B, C, D of order w with
  A^2 + B^2 + C^2 + D^2 = 4 w I give H = [[A, B, C, D], [-B, A, -D, C], [-C, D, A, -B], [-D, -C, B, A]].
  The sequences are found by ``williamson`` (a search written here, see its docstring). m = 172 (w = 43).
* Goethals-Seidel with T-matrices (Cooper-Wallis), m = 156 = 4 x 3 x 13: Williamson matrices of order
  13 and the T-matrices of order 3 (circulants with a single 1 at offsets 0, 1, 2) give four circulants
  E_1..E_4 of order 39 (Z_39 = Z_3 x Z_13) with sum E_i E_i^T = 156 I, which the Goethals-Seidel array
  turns into a Hadamard matrix.

Symmetric: every order but 156 and 172 (the Williamson and Goethals-Seidel arrays are not), so the
transform's gradient and inverse use H^T there (op.py passes ``transpose``).
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch

# m = 4 x (odd part): the orders the transform uses; m = 40 and other m 2^j reduce to these
ORDERS = (12, 20, 28, 36, 44, 52, 60, 108, 140, 148, 156, 172)
# what the user-facing list names (QuaRot's orders and 148); 40 = 20 x 2
LISTED = (12, 20, 28, 36, 40, 44, 52, 60, 108, 140, 148, 156, 172)


def split(n: int) -> tuple[int, int] | None:
    """(m, p) with n = m p, p a power of two and m in ORDERS or m = 1 (n a power of two), or None
    where this module has no Hadamard matrix of order n. m is the smallest such order (4 times the odd
    part of n), so n = 40 x 2^k splits as (20, 2^(k+1))."""
    if n < 1:
        return None
    p = n & -n  # the largest power of two dividing n
    odd = n // p
    if odd == 1:
        return 1, n
    m = 4 * odd
    if m in ORDERS and n % m == 0:
        return m, n // m
    return None


def supported_text() -> str:
    """The accepted sizes, in words, for error messages."""
    return ("n = m x 2^k with m = 1 (powers of two), " + ", ".join(map(str, LISTED)) + " (k >= 0 for m > 1; "
            "40 x 2^k is 20 x 2^(k+1))")


# --- finite fields GF(p^k), k <= 3, enough for the quadratic character -----------------------------


def _prime_power(q: int) -> tuple[int, int] | None:
    for p in range(2, q + 1):
        if q % p == 0:
            k, r = 0, q
            while r % p == 0:
                r //= p
                k += 1
            return (p, k) if r == 1 else None
    return None


class _Field:
    """GF(p^k): elements 0..q-1 are polynomials over GF(p) by their base-p digits (lowest first),
    multiplied modulo a monic irreducible polynomial of degree k (found by search; for k <= 3 a
    polynomial without roots is irreducible)."""

    def __init__(self, q: int):
        pk = _prime_power(q)
        assert pk is not None and pk[1] <= 3, q
        self.q, (self.p, self.k) = q, pk
        p, k = self.p, self.k
        self.modulus = None
        if k > 1:
            for low in range(p**k):  # monic x^k + (low's digits)
                coeffs = self._digits(low) + [1]
                if all(sum(c * pow(r, i, p) for i, c in enumerate(coeffs)) % p for r in range(p)):
                    self.modulus = coeffs
                    break
        self.add = np.array([[self._from(self._vadd(self._digits(a), self._digits(b))) for b in range(q)]
                             for a in range(q)])
        self.neg = np.array([self._from([(-d) % p for d in self._digits(a)]) for a in range(q)])
        squares = {self._mul(a, a) for a in range(1, q)}
        self.chi = np.array([0] + [1 if a in squares else -1 for a in range(1, q)])

    def _digits(self, a: int) -> list[int]:
        return [(a // self.p**i) % self.p for i in range(self.k)]

    def _from(self, digits) -> int:
        return sum(d * self.p**i for i, d in enumerate(digits))

    def _vadd(self, u, v):
        return [(x + y) % self.p for x, y in zip(u, v)]

    def _mul(self, a: int, b: int) -> int:
        p, k = self.p, self.k
        u, v = self._digits(a), self._digits(b)
        prod = [0] * (2 * k - 1)
        for i, x in enumerate(u):
            for j, y in enumerate(v):
                prod[i + j] = (prod[i + j] + x * y) % p
        for d in range(2 * k - 2, k - 1, -1):  # reduce by the monic modulus, highest degree first
            c = prod[d]
            if c:
                for i, m in enumerate(self.modulus):
                    prod[d - k + i] = (prod[d - k + i] - c * m) % p
        return self._from(prod[:k])

    def jacobsthal(self) -> np.ndarray:
        """Q[i, j] = chi(e_j - e_i)."""
        q = self.q
        diff = np.array([[self.add[j, self.neg[i]] for j in range(q)] for i in range(q)])
        return self.chi[diff]


def paley1(q: int) -> np.ndarray:
    """A symmetric Hadamard matrix of order q + 1 for a prime power q = 3 (mod 4) (module docstring)."""
    f = _Field(q)
    assert q % 4 == 3
    total = f.add  # e_i + e_j
    c = np.where(total == 0, 1, 0) - f.chi[total]
    h = np.empty((q + 1, q + 1), dtype=np.int64)
    h[0, 0] = -1
    h[0, 1:] = 1
    h[1:, 0] = 1
    h[1:, 1:] = c
    return h


def paley2(q: int) -> np.ndarray:
    """A symmetric Hadamard matrix of order 2 (q + 1) for a prime power q = 1 (mod 4)."""
    f = _Field(q)
    assert q % 4 == 1
    s = np.zeros((q + 1, q + 1), dtype=np.int64)
    s[0, 1:] = 1
    s[1:, 0] = 1
    s[1:, 1:] = f.jacobsthal()
    zero_block = np.array([[1, -1], [-1, -1]])
    one_block = np.array([[1, 1], [1, -1]])
    return np.kron(np.eye(q + 1, dtype=np.int64), zero_block) + np.kron(s, one_block)


def _circulant(first_row) -> np.ndarray:
    row = np.asarray(first_row)
    n = len(row)
    return row[(np.arange(n)[None, :] - np.arange(n)[:, None]) % n]


def _orbits(n: int, generators) -> list[list[int]]:
    """The orbits of Z_n under multiplication by ``generators``."""
    seen, orbits = set(), []
    for x in range(n):
        if x in seen:
            continue
        orbit, todo = {x}, [x]
        while todo:
            y = todo.pop()
            for g in generators:
                z = y * g % n
                if z not in orbit:
                    orbit.add(z)
                    todo.append(z)
        seen |= orbit
        orbits.append(sorted(orbit))
    return orbits


@functools.lru_cache(maxsize=None)
def williamson(w: int, max_orbits: int = 12) -> tuple[np.ndarray, ...]:
    """First rows of Williamson matrices A, B, C, D of odd order w: symmetric circulant +-1 matrices with
    A^2 + B^2 + C^2 + D^2 = 4 w I.

    The search: a symmetric circulant has a real spectrum, and the condition is that at every frequency
    the four squared spectra sum to 4 w. The search looks among sequences constant on the orbits of a
    multiplier group {1, -1, g, -g, g^2, ...} of the units mod w (the symmetry many known Williamson
    matrices have), smallest number of orbits first: every +-1 pattern on the orbits is a candidate;
    candidates whose squared spectrum passes 4 w anywhere are dropped; the row sums a, b, c, d must
    satisfy a^2 + b^2 + c^2 + d^2 = 4 w; and pairs (A, B) are matched with pairs (C, D) by their summed
    squared spectra (a dictionary of one side, looked up from the other). Deterministic; for w = 13 and
    43 it takes well under a second. Raises LookupError where no group with at most ``max_orbits``
    orbits has a solution."""
    units = [u for u in range(2, w - 1) if math.gcd(u, w) == 1]
    groups = {}
    for g in units:
        orbits = _orbits(w, [g, w - 1])
        groups.setdefault(tuple(map(tuple, orbits)), g)
    groups.setdefault(tuple(map(tuple, _orbits(w, [w - 1]))), w - 1)
    for orbits in sorted(groups, key=len):
        if len(orbits) > max_orbits:
            break
        found = _williamson_on_orbits(w, orbits)
        if found is not None:
            return found
    raise LookupError(f"no Williamson matrices of order {w} invariant under a multiplier group with at most "
                      f"{max_orbits} orbits")


def _williamson_on_orbits(w: int, orbits) -> tuple[np.ndarray, ...] | None:
    k = len(orbits)
    membership = np.zeros((k, w))
    for i, orbit in enumerate(orbits):
        membership[i, list(orbit)] = 1
    signs = ((np.arange(2**k)[:, None] >> np.arange(k)) & 1) * 2 - 1
    seqs = (signs @ membership).astype(np.int64)  # every +-1 pattern on the orbits
    power = np.fft.fft(seqs, axis=1).real ** 2  # real: the sequences are symmetric
    keep = (power <= 4 * w + 1e-6).all(axis=1)
    seqs, power = seqs[keep], power[keep]
    freqs = [orbit[0] for orbit in orbits]  # the spectrum is constant on the same orbits
    power = power[:, freqs]
    by_sum = {}
    for i, s in enumerate(seqs.sum(axis=1)):
        if s > 0:
            by_sum.setdefault(int(s), []).append(i)
    top = math.isqrt(4 * w)
    for a in range(1, top + 1, 2):
        for b in range(a, top + 1, 2):
            for c in range(b, top + 1, 2):
                d2 = 4 * w - a * a - b * b - c * c
                d = math.isqrt(max(d2, 0))
                if d < c or d * d != d2 or not all(v in by_sum for v in (a, b, c, d)):
                    continue
                ia, ib, ic, id_ = (np.array(by_sum[v]) for v in (a, b, c, d))
                # squared spectra are not integers: pairs are matched on their sums to 1e-6 (equal
                # sums agree to ~1e-12)
                left = (power[ia][:, None, :] + power[ib][None, :, :]).reshape(-1, len(freqs))
                table = {}
                for t in np.flatnonzero((left <= 4 * w + 1e-6).all(axis=1)):
                    table.setdefault(np.rint(left[t] * 1e6).astype(np.int64).tobytes(), t)
                right = (4 * w - power[ic][:, None, :] - power[id_][None, :, :]).reshape(-1, len(freqs))
                for t in np.flatnonzero((right >= -1e-6).all(axis=1)):
                    hit = table.get(np.rint(right[t] * 1e6).astype(np.int64).tobytes())
                    if hit is not None:
                        i, j = divmod(int(hit), len(ib))
                        u, v = divmod(int(t), len(id_))
                        return tuple(seqs[x] for x in (ia[i], ib[j], ic[u], id_[v]))
    return None


def _williamson_array(blocks) -> np.ndarray:
    a, b, c, d = blocks
    return np.block([[a, b, c, d], [-b, a, -d, c], [-c, d, a, -b], [-d, -c, b, a]])


def williamson_hadamard(w: int) -> np.ndarray:
    """The Hadamard matrix of order 4 w from Williamson matrices of order w (the Williamson array)."""
    return _williamson_array([_circulant(r) for r in williamson(w)])


def goethals_seidel(rows) -> np.ndarray:
    """The Goethals-Seidel array of four circulants (first rows) with sum A_i A_i^T = 4 n I."""
    a1, a2, a3, a4 = (_circulant(r) for r in rows)
    r = np.fliplr(np.eye(len(rows[0]), dtype=np.int64))
    return np.block([[a1, a2 @ r, a3 @ r, a4 @ r],
                     [-a2 @ r, a1, a4.T @ r, -a3.T @ r],
                     [-a3 @ r, -a4.T @ r, a1, a2.T @ r],
                     [-a4 @ r, a3.T @ r, -a2.T @ r, a1]])


def cooper_wallis(t: int, w: int) -> np.ndarray:
    """Order 4 t w from the T-matrices of order t = 3 (a single 1 at offsets 0, 1, 2: sum X_j X_j^T = 3 I,
    disjoint supports covering every offset) and Williamson matrices of order w coprime to t:
    E_i = sum_j X_j (x) W_ij, W the Williamson array's blocks, is a circulant of order t w (Chinese
    remainders: Z_tw = Z_t x Z_w) and sum_i E_i E_i^T = 4 t w I (the array's columns are orthogonal)."""
    assert t == 3 and math.gcd(t, w) == 1
    a, b, c, d = williamson(w)
    rows_of_array = [[a, b, c, d], [-b, a, -d, c], [-c, d, a, -b], [-d, -c, b, a]]
    offsets = np.arange(t * w)
    rows = []
    for blocks in rows_of_array:
        # X_j's first row is 1 at offset j (j < 3), X_4 = 0: entry at offset e is W_i,(e mod 3)(e mod w)
        rows.append(np.array([blocks[e % t][e % w] for e in offsets]))
    return goethals_seidel(rows)


def _build(m: int) -> np.ndarray:
    if m == 1:
        return np.ones((1, 1), dtype=np.int64)
    if m % 8 == 0 and (m // 2) in LISTED:
        return np.kron(_build(m // 2), np.array([[1, 1], [1, -1]]))  # Sylvester doubling
    q = m - 1
    pk = _prime_power(q)
    if pk is not None and pk[1] <= 3 and q % 4 == 3:
        return paley1(q)
    q = m // 2 - 1
    pk = _prime_power(q)
    if m % 2 == 0 and pk is not None and pk[1] <= 3 and q % 4 == 1:
        return paley2(q)
    if m == 156:
        return cooper_wallis(3, 13)
    if m % 4 == 0:
        return williamson_hadamard(m // 4)
    raise ValueError(m)


@functools.lru_cache(maxsize=None)
def hadamard_of_order(m: int) -> torch.Tensor:
    """H_m (float64 on the CPU, entries +-1) for m in LISTED or 1; cached. Not a copy: do not modify."""
    if m != 1 and m not in LISTED:
        raise ValueError(f"no Hadamard matrix of order {m} here; orders: 1, " + ", ".join(map(str, LISTED)))
    h = _build(m)
    assert h.shape == (m, m) and (h @ h.T == m * np.eye(m, dtype=np.int64)).all(), m
    return torch.from_numpy(h.astype(np.float64))


@functools.lru_cache(maxsize=None)
def is_symmetric(m: int) -> bool:
    h = hadamard_of_order(m)
    return bool(torch.equal(h, h.T))
