package cache

// A Subscription moves from one Source to another of the same resource
// when the automatic scope strategy changes the Source that serves its
// namespace (scope.go): from a namespace's informer to the cluster-wide
// one, and back. The move is invisible to the subscriber: it happens only
// where the target's log holds every change after the subscriber's
// position, so the subscriber reads on from the target exactly where it
// was (both Sources watch the same history: their resourceVersions are
// the API server's), with no RESET, nothing lost and nothing twice. Until
// then the subscriber reads its Source as before, and its hold on the
// target keeps the target running.

// requestMoveLocked asks s to move to the Source of key, and wakes its
// reader. s.source().mu must be held.
func (s *Subscription) requestMoveLocked(key Key) {
	if s.mover == nil {
		return
	}
	s.move.Store(&key)
	s.source().broadcastLocked()
}

// tryMove moves the subscription to the Source of key, if it can resume
// there exactly where it is: it has read everything its Source logged,
// and the target's log holds every change after that position. It
// reports whether it moved, and when not, the channel that the target
// closes when it changes next (nil if waiting for it is no use). Only
// the reading goroutine calls it, with no lock held.
func (s *Subscription) tryMove(key *Key) (moved bool, targetChanged <-chan struct{}) {
	src := s.source()
	if *key == src.key { // asked back where it is
		s.move.CompareAndSwap(key, nil)
		s.dropTarget()
		return false, nil
	}
	t, ok := s.holdTarget(*key, src)
	if !ok {
		s.move.CompareAndSwap(key, nil)
		return false, nil
	}
	src.mu.Lock()
	p, caughtUp := s.cursor, s.cursor == src.events.last && !src.opaque
	src.mu.Unlock()
	if !caughtUp {
		return false, nil // it reads on, and tries again
	}
	t.mu.Lock()
	var at mark
	if t.synced && t.terminal == nil && !t.opaque {
		at, ok = t.events.resumeAt(p.rv)
	} else {
		ok = false
	}
	if !ok { // it started after p (its Source moves on), or has not reached p yet
		ch := t.notify
		t.mu.Unlock()
		return false, ch
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		t.mu.Unlock()
		return false, nil
	}
	t.subs[s] = struct{}{}
	s.cursor = at
	s.src.Store(t)
	old := s.release
	s.release, s.target, s.targetRelease = s.targetRelease, nil, nil
	s.mu.Unlock()
	t.mu.Unlock()

	src.mu.Lock()
	delete(src.subs, s)
	src.mu.Unlock()
	old()
	s.move.CompareAndSwap(key, nil)
	t.hooks.moves.Inc()
	return true, nil
}

// holdTarget returns the Source of key, holding it for the subscription
// (once; a hold on another target is dropped). It reports false when the
// Source cannot be had, or the subscription is closed.
func (s *Subscription) holdTarget(key Key, like *Source) (*Source, bool) {
	s.mu.Lock()
	t, closed := s.target, s.closed
	s.mu.Unlock()
	if closed {
		return nil, false
	}
	if t != nil && t.key == key {
		return t, true
	}
	s.dropTarget()
	t, release, err := s.mover(key, like)
	if err != nil {
		like.log.Info("a subscription stays on its informer: the one to move to cannot be had", "to", key.String(), "err", err)
		return nil, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		release()
		return nil, false
	}
	s.target, s.targetRelease = t, release
	return t, true
}

// dropTarget releases the hold on a target the subscription did not move
// to.
func (s *Subscription) dropTarget() {
	s.mu.Lock()
	release := s.targetRelease
	s.target, s.targetRelease = nil, nil
	s.mu.Unlock()
	if release != nil {
		release()
	}
}
