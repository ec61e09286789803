"""The one seam between the training loop and data parallelism (Caffe's ``Solver::Callback`` with its action
function, ChainerMN's wrapped optimizer): the points of an iteration where a replica may act, as the methods of
:class:`Seam`. ``Solver.add_seam`` gives the solver one; the solver calls the points in the fixed order its module
docstring lists (layerforge/solvers/solver.py), and nothing else of the solver is set from outside.

What data parallelism may do, and nothing more:

- agree on where training starts (the iteration, and through it the parameters) before the first iteration;
- act before each forward-backward pass (arm per-layer sends) and after each layer's backward (send gradients
  that are final);
- make the loss the whole batch's (replicas of one split batch);
- make the summed gradients the whole batch's before the update (an allreduce, a host sum, a gather), and say
  that this iteration makes no update (the first iteration of double buffering, a replica that lets the root
  update alone);
- say which part of the parameters this replica updates (replicas sharing one copy update a share each);
- make the replicas' parameters the same again after the update (a broadcast, a barrier);
- combine the test outputs of replicas that each test a shard (a detection test: gather their detections);
- agree on the action a signal requests (every replica snapshots or stops at the same iteration);
- check agreement before a snapshot, and wait after it until the snapshot is whole; gather the replicas' own
  states (random streams, read positions, engine choices) for the snapshot, and say which is this replica's;
- say which replica is the root (it displays, logs the test scores and writes the snapshots), and add lines to
  the periodic display.

Implementations: layerforge/dataparallel/ranks.py (MPI ranks: the dense and the sparse gradient exchange, the
ranks' agreement) and layerforge/dataparallel/cgdp (a host's workers: host and tree
synchronisation, the CPU replicas' shared update, the worker's place among its peers, the split batch's mean
outputs, the phase timer).
"""


class Seam:
    """What data parallelism does at each point of the training loop; this base class does nothing (one process
    alone). Override the points a replica needs; each one is documented with where the solver calls it.

    Attributes:
        root: this replica displays, logs test scores and writes snapshots (the others train silently).
        shares_tests: every replica runs the tests, on its shard of the test data, and :meth:`reduce_test`
            combines them; otherwise only the root tests.
        shares_loss: :meth:`reduce_loss` needs every replica (a split batch), so all of them compute the loss of
            the final weights that :meth:`~layerforge.solvers.Solver.solve` displays.
        layer_hooks: the solver calls :meth:`layer_gradients_ready` after every layer's backward (a hook on the
            train net; a net with such hooks is not replayed as a CUDA graph).
        agrees: :meth:`agree` makes this replica act with others that run in processes of their own (MPI ranks):
            a second Ctrl-C then never interrupts this one alone, which would end the job without a snapshot
            (layerforge/solvers/signals.py).
    """

    root = True
    shares_tests = False
    shares_loss = False
    layer_hooks = False
    agrees = False

    def start(self, iteration):
        """Once, before the solver's first iteration (after any restore): the replicas agree where they start.
        Returns the iteration to start from."""
        return iteration

    def before_pass(self, k):
        """Before forward-backward pass ``k`` of the ``iter_size`` passes of an iteration (before its inputs are
        fed)."""

    def layer_gradients_ready(self, i):
        """After layer ``i``'s backward, in every pass (layers in backward order): the diffs of the parameters that
        only layers ``>= i`` hold are final for this pass. Called only when :attr:`layer_hooks` is set."""

    def reduce_loss(self, loss):
        """After the passes: the iteration's mean ``loss`` of this replica -> the loss the solver smooths and displays
        (and the train outputs the display shows)."""
        return loss

    def before_update(self):
        """After the passes, before the update: the diffs hold this replica's gradients summed over the passes;
        make them what the update must use. Returns False when this iteration makes no update here."""
        return True

    def update_share(self):
        """Which part of the learnable parameters this replica updates: None (all of them) or ``{parameter index:
        rows}``, rows a slice of the parameter's first axis or None (all of it)."""
        return None

    def combine_gradient(self, i, part):
        """In the update, right before the values ``part`` of learnable parameter ``i`` are updated (``(start,
        stop)`` of its flattened values, within this replica's share, or None for all of it): make their diff what
        the update must use. Replicas that combine their gradients there (CPU replicas: the mean of their slots,
        a block at a time, while the update has the block in the cache) do it here; after :meth:`before_update`."""

    def after_update(self):
        """Right after this replica's update (or after the update it did not make)."""

    def end_iteration(self, iteration, loss):
        """After iteration ``iteration`` (the solver's ``iter`` is now ``iteration + 1``), before the callbacks, the
        signal requests and the snapshot: replicas that did not update take the parameters, replicas that update
        a share wait for the others."""

    def reduce_test(self, sums, loss, n):
        """After test net passes: this replica's summed test outputs (a list of float64 arrays), summed loss and pass
        count -> those of every replica that tested (see :attr:`shares_tests`)."""
        return sums, loss, n

    def gather_test_rows(self, rows):
        """After the passes of an ``eval_type: DETECTION`` test, once per test net output, before :meth:`reduce_test`:
        this replica's DetectionEvaluate rows (an ``(n, 5)`` float64 array: image, label, score, tp, fp) -> the
        rows of every replica that tested (see :attr:`shares_tests`), whose mAP is the test's."""
        return rows

    def agree(self, action):
        """After each iteration and before each test pass: this replica's requested action (``"none"``,
        ``"snapshot"`` or ``"stop"``, from a signal) -> the action every replica takes."""
        return action

    def before_snapshot(self):
        """On every replica, before a snapshot is written (by the root)."""

    def after_snapshot(self):
        """On every replica, after a snapshot was written (by the root)."""

    def describe(self, seconds_per_iteration, iterations):
        """Lines for the periodic train display (the root's), given the time per iteration since the last one."""
        return []

    def gather_states(self, states):
        """When a snapshot is written, on every replica: ``states``, a list of JSON texts of replicas' own states (a
        random stream, the read positions, AUTO's engine choices; this replica's alone at first) -> every replica's,
        in replica order, on the root (which writes them with the snapshot); anything on the others."""
        return states

    def replica(self):
        """This replica's place among those whose own states a snapshot keeps: ``(index, count)``."""
        return 0, 1


class Seams(Seam):
    """Several seams acting as one, each point called on each seam in the order they were added: a reduction
    hands each seam's result to the next, :meth:`before_update` asks every seam (the update happens when all say
    so), the root is the replica that every seam calls root. At most one seam may name an update share."""

    def __init__(self, seams=()):
        self.seams = list(seams)

    def add(self, seam):
        self.seams.append(seam)

    root = property(lambda self: all(s.root for s in self.seams))
    shares_tests = property(lambda self: any(s.shares_tests for s in self.seams))
    shares_loss = property(lambda self: any(s.shares_loss for s in self.seams))
    layer_hooks = property(lambda self: any(s.layer_hooks for s in self.seams))
    agrees = property(lambda self: any(s.agrees for s in self.seams))

    def start(self, iteration):
        for s in self.seams:
            iteration = s.start(iteration)
        return iteration

    def before_pass(self, k):
        for s in self.seams:
            s.before_pass(k)

    def layer_gradients_ready(self, i):
        for s in self.seams:
            if s.layer_hooks:
                s.layer_gradients_ready(i)

    def reduce_loss(self, loss):
        for s in self.seams:
            loss = s.reduce_loss(loss)
        return loss

    def before_update(self):
        return all([s.before_update() for s in self.seams])  # every seam runs, whatever the others say

    def update_share(self):
        shares = [share for share in (s.update_share() for s in self.seams) if share is not None]
        if len(shares) > 1:
            raise ValueError("two seams name the part of the parameters this replica updates")
        return shares[0] if shares else None

    def combine_gradient(self, i, part):
        for s in self.seams:
            s.combine_gradient(i, part)

    def after_update(self):
        for s in self.seams:
            s.after_update()

    def end_iteration(self, iteration, loss):
        for s in self.seams:
            s.end_iteration(iteration, loss)

    def reduce_test(self, sums, loss, n):
        for s in self.seams:
            sums, loss, n = s.reduce_test(sums, loss, n)
        return sums, loss, n

    def gather_test_rows(self, rows):
        for s in self.seams:
            rows = s.gather_test_rows(rows)
        return rows

    def agree(self, action):
        for s in self.seams:
            action = s.agree(action)
        return action

    def before_snapshot(self):
        for s in self.seams:
            s.before_snapshot()

    def after_snapshot(self):
        for s in self.seams:
            s.after_snapshot()

    def describe(self, seconds_per_iteration, iterations):
        return [line for s in self.seams for line in s.describe(seconds_per_iteration, iterations)]

    def gather_states(self, states):
        for s in self.seams:
            states = s.gather_states(states)
        return states

    def replica(self):
        return next((place for place in (s.replica() for s in self.seams) if place[1] > 1), (0, 1))
