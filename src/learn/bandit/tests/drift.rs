//! drift: changes detected and followed, down and up, and bad luck not taken for one.

use super::*;

/// First choices of arm 1 ("later") among the last 50 of `tasks` tasks, summed over `seeds`
/// (of 50 per seed), one stage of three arms in one cluster: "leader" succeeds 80% of the time,
/// "later" 30% until task 400 and 98% from then on, "middle" 50%. A failed call is followed by
/// fallbacks (as the tree does), and every call is learned.
fn upward_drift_share(
    config: PolicyConfig,
    tune: impl Fn(&mut Tuning),
    tasks: usize,
    seeds: std::ops::RangeInclusive<u64>,
) -> usize {
    let stages = search_stage(&["leader", "later", "middle"]);
    let f = feats(&[("topic", "news")]);
    let mut later_first = 0;
    for seed in seeds {
        let mut p = tuned(config.clone(), stages.clone(), &tune);
        let mut rng = fastrand::Rng::with_seed(seed);
        for t in 0..tasks {
            let truth = [0.8, if t < 400 { 0.3 } else { 0.98 }, 0.5];
            let first = p.choose(&f, &mut rng).indices[0];
            if t + 50 >= tasks && first == 1 {
                later_first += 1;
            }
            let mut tried = vec![first];
            loop {
                let arm = tried[tried.len() - 1];
                let ok = rng.f64() < truth[arm];
                let played = p.stages()[0].arms[arm].clone();
                search_obs(&mut p, &f, played, ok);
                match p.fallback(&f, 0, &tried, &mut rng) {
                    Some(next) if !ok => tried.push(next),
                    _ => break,
                }
            }
        }
    }
    later_first
}

#[test]
fn an_arm_long_written_off_is_taken_up_when_it_becomes_the_best() {
    // 100 to 150 tasks after the change, the arm that became the best has nearly every
    // first attempt, under information-directed sampling alone (486 of 500) and with the
    // default tenth of Thompson sampling's choices (489); 50 to 100 tasks after, it is taken
    // up in some seeds and not yet in others (282 of 500 under information-directed sampling
    // alone).
    let ids = upward_drift_share(ids_alone(), |_| {}, 550, 21..=30);
    assert!(ids >= 400, "information-directed: {ids} of 500");
    let mixed = upward_drift_share(PolicyConfig::default(), |_| {}, 550, 21..=30);
    assert!(mixed >= 400, "with the Thompson share: {mixed} of 500");
    // The detectors compared under Thompson sampling with fallbacks drawn from the posterior,
    // 50 to 100 tasks after the change: a detector as strict upward as downward takes the arm
    // up about half as often. Over seeds 1-100 (5,000 first choices), 3,492 against 1,705 with
    // the polar method's normal variates and 3,253 against 1,735 with the ziggurat's; blocks
    // of ten seeds range from 1.3 to 5.8 times, so the comparison takes thirty. (Fallbacks by
    // upper bound, the default, did not take the arm up sooner under the symmetric detector
    // over those 100 seeds: 1,518 and 1,247.)
    let symmetric = PolicyConfig {
        change_threshold_up: 10.0,
        ..thompson()
    };
    let now = upward_drift_share(thompson(), |t| t.fallback_upper_sd = 0.0, 500, 1..=30);
    let symmetric_drawn = upward_drift_share(
        symmetric,
        |t| {
            t.fallback_upper_sd = 0.0;
            t.change_keep_up = 2.0;
        },
        500,
        1..=30,
    );
    assert!(
        now >= 600 && 2 * now > 3 * symmetric_drawn,
        "now {now} of 1,500, symmetric {symmetric_drawn}"
    );
}

#[test]
fn a_drop_is_detected_and_the_policy_switches() {
    let mut p = policy();
    let f = feats(&[("tenant", "A")]);
    let mut rng = fastrand::Rng::with_seed(21);
    let obs = |arm: usize, ok: bool| {
        let arm = Arm::new(if arm == 0 { "a" } else { "b" }, "s");
        stage_obs(f.clone(), "normalize", arm, ok, 200.0, 0.001)
    };
    for i in 0..200 {
        p.update(&obs(0, i % 20 != 0));
        p.update(&obs(1, i % 3 != 0));
    }
    assert_eq!(p.greedy(&f).0[1], 0);
    for _ in 0..15 {
        p.update(&obs(0, rng.f64() < 0.1));
    }
    assert!(p.changes_detected() > 0);
    assert_eq!(p.greedy(&f).0[1], 1, "switched after the drop");
}

#[test]
fn bad_luck_on_an_arm_at_four_in_five_is_not_taken_for_a_change() {
    // An arm that succeeds 80% of the time has streaks of failures now and then. The
    // Page-Hinkley test this policy used to run fired 12 times on these 1,000 outcomes (its
    // false alarms grow with the stream's variance, and each one wrote the arm off in its
    // cluster); the likelihood-ratio test fires on none.
    let mut p = policy();
    let f = feats(&[("filetype", "pdf"), ("tenant", "A")]);
    let mut rng = fastrand::Rng::with_seed(8);
    for _ in 0..1000 {
        let ok = rng.f64() < 0.8;
        p.update(&stage_obs(
            f.clone(),
            "normalize",
            Arm::new("a", "s"),
            ok,
            200.0,
            0.001,
        ));
    }
    assert_eq!(p.changes_detected(), 0);
}

#[test]
fn a_change_in_one_tenant_keeps_the_other_tenants_evidence() {
    let mut p = policy();
    let (fa, fb) = (
        feats(&[("filetype", "pdf"), ("tenant", "A")]),
        feats(&[("filetype", "pdf"), ("tenant", "B")]),
    );
    let obs = |f: &BTreeMap<String, String>, arm: usize, ok: bool| {
        let arm = Arm::new(if arm == 0 { "a" } else { "b" }, "s");
        stage_obs(f.clone(), "normalize", arm, ok, 200.0, 0.001)
    };
    for i in 0..200 {
        for f in [&fa, &fb] {
            p.update(&obs(f, 0, i % 20 != 0));
            p.update(&obs(f, 1, i % 3 != 0));
        }
    }
    // Arm `a` starts failing for tenant B only; tenant A goes on as before.
    for i in 0..20 {
        p.update(&obs(&fb, 0, i % 10 == 9));
        p.update(&obs(&fa, 0, i % 20 != 0));
    }
    assert!(p.changes_detected() > 0);
    assert_eq!(p.greedy(&fb).0[1], 1, "tenant B switched");
    assert_eq!(p.greedy(&fa).0[1], 0, "tenant A did not");
    // The coarser nodes that mix both tenants detected the change too; tenant A's own
    // evidence survived it (forgotten, it would be back to a few pseudo-counts).
    let a = p.arm_index("normalize", &Arm::new("a", "s")).unwrap();
    let snap = p.snapshot();
    let a_counts = |key: &str| {
        snap.nodes
            .iter()
            .find(|n| n.0 == key)
            .map(|n| n.2[a].successes + n.2[a].failures)
            .unwrap_or(0.0)
    };
    assert!(
        a_counts("filetype=pdf|tenant=A") > 100.0,
        "tenant A kept {}",
        a_counts("filetype=pdf|tenant=A")
    );
    assert!(a_counts("filetype=pdf|tenant=B") < 30.0, "tenant B forgot");
}

#[test]
fn a_change_in_one_tenant_is_found_among_many_features() {
    // Six features: the exact cluster of a task is one of 486 and sees almost none of the
    // tasks, so a change is only found in time at the coarser nodes of the sparse lattice
    // (here the tenant's own node); before that lattice detected at its single features, the
    // policy went on choosing the broken arm for tenant B.
    let mut p = policy();
    let mut rng = fastrand::Rng::with_seed(5);
    let task = |tenant: &str, rng: &mut fastrand::Rng| {
        let mut pairs = vec![("tenant".to_string(), tenant.to_string())];
        for name in ["channel", "lang", "priority", "region", "size"] {
            pairs.push((name.to_string(), format!("v{}", rng.usize(..3))));
        }
        pairs.into_iter().collect::<BTreeMap<String, String>>()
    };
    let obs = |f: &BTreeMap<String, String>, arm: usize, ok: bool| {
        let arm = Arm::new(if arm == 0 { "a" } else { "b" }, "s");
        stage_obs(f.clone(), "normalize", arm, ok, 200.0, 0.001)
    };
    for _ in 0..300 {
        for tenant in ["A", "B"] {
            let f = task(tenant, &mut rng);
            p.update(&obs(&f, 0, rng.f64() < 0.95));
            p.update(&obs(&f, 1, rng.f64() < 0.7));
        }
    }
    let (fa, fb) = (task("A", &mut rng), task("B", &mut rng));
    assert_eq!(p.greedy(&fb).0[1], 0);
    // Arm `a` starts failing for tenant B only.
    for _ in 0..25 {
        let f = task("B", &mut rng);
        p.update(&obs(&f, 0, rng.f64() < 0.1));
        let f = task("A", &mut rng);
        p.update(&obs(&f, 0, rng.f64() < 0.95));
    }
    assert!(p.changes_detected() > 0);
    assert_eq!(p.greedy(&fb).0[1], 1, "tenant B switched");
    assert_eq!(p.greedy(&fa).0[1], 0, "tenant A did not");
}
