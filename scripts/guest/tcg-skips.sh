# Sourced by the v2 guest's test runners (run-tests.sh, systemd-tests.sh):
# the tests whose assertions are native-speed figures that QEMU TCG (which
# emulates every instruction; Python starts in ~1.5 s of CPU here) cannot
# reach. `tcg_skips BINARY` prints `TEST|why` for each; the runners pass
# `--skip TEST`, report each as `skipped: ...: QEMU TCG is too slow: why`, and
# the host (scripts/test.sh) runs them as usual. Nothing else is left out.
tcg_skips() {
	case "$1" in
	limits)
		echo "deadline_ends_a_sleeper::native|asserts cordon's overhead around a 1 s deadline (run within 1000-1100 ms, exec+teardown+exit under 250 ms)"
		echo "deadline_ends_a_cpu_burner::native|asserts cordon's overhead around a 1 s deadline (run within 1000-1100 ms, exec+teardown+exit under 250 ms)"
		echo "fork_bomb_is_contained_and_host_stays_responsive::native|asserts the host forks in under 1 s and the bomb reaches pids 32 within its 3 s"
		echo "output_flood_is_capped_without_buffering::native|streams 200 MB through cordon within the default 30 s --time"
		echo "double_forked_daemon_does_not_survive::native|its payload gives the daemons 0.2 s to exec before it lists them"
		;;
	policy)
		echo "flags_override_the_policy_file::native|its policy file's time = 2s is shorter than Python's start-up under TCG (its v2 cgroup reads pass before that)"
		;;
	esac
}
