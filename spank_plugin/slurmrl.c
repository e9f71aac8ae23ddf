/*
 * slurmrl SPANK plugin: the --rl-* directives of RL jobs.
 *
 * Registers --rl-gpus, --rl-model, --rl-mem, --rl-mux, --rl-group, --rl-max-slowdown,
 * --rl-profile, --rl-layout and --rl-steps for sbatch, #SBATCH lines, salloc and srun.
 * Each value is checked in its option callback, so a malformed one fails the submission
 * with a message naming the option and the accepted form; cross-option checks run in
 * init_post_opt.
 * Valid values reach the job as SLURMRL_* variables: spank_setenv() in the remote context
 * (every step, the batch step included, sees the options again there), and
 * spank_job_control_setenv() in allocator/local context for prolog/epilog scripts
 * (which see them as SPANK_SLURMRL_*).
 *
 * No decisions are made here: the controller re-validates everything (slurmrl/directives.py
 * mirrors these checks and messages word for word).
 *
 * plugstack.conf arguments: controller=URL (exported as SLURMRL_CONTROLLER for RL jobs),
 * debug=yes|no (log the exported values). Unknown arguments are an error, and so is a URL
 * the Python client (slurmrl/client/rpc.py, split_url) would refuse: http://HOST[:PORT].
 *
 * Known limits: a value is echoed in messages with non-printable characters replaced by
 * '?' and cut at 64 characters.
 */

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <slurm/spank.h>

SPANK_PLUGIN(slurmrl, 1);

#define GPUS_MAX 1024L
#define GPU_TYPE_MAX 64
#define MODEL_MAX 255
#define GROUP_MAX 64
#define PROFILE_MAX 256
#define URL_MAX 1023
#define MEM_MAX_BYTES (1024ULL << 40) /* 1024T */
#define STEP_MAX_S 1000000.0
#define STEPS_MAX 10000000L

enum opt_id { OPT_GPUS = 1, OPT_MODEL, OPT_MEM, OPT_MUX, OPT_GROUP, OPT_SLOWDOWN,
              OPT_PROFILE, OPT_LAYOUT, OPT_STEPS };

static const char *const phase_names[] = { "rollout", "train", "sync", "reward", "idle" };
#define N_PHASES (sizeof(phase_names) / sizeof(phase_names[0]))

/* Plugin configuration (plugstack.conf) and the job's validated directives. */
static char controller[URL_MAX + 1];
static int debug;

static long gpus;           /* 0: not given */
static char gpu_type[GPU_TYPE_MAX + 1]; /* --rl-gpus=TYPE:N's TYPE; "": any */
static char model[MODEL_MAX + 1];
static unsigned long long mem_bytes;  /* 0: not given */
static char mux[8];
static char group[GROUP_MAX + 1];
static char slowdown[32];
static char profile[PROFILE_MAX + 1];
static char layout[16];
static long rollout_gpus;   /* 0: default (gpus / 2) */
static int layout_r_given;
static long steps;          /* 0: not given */

/* A value as it may be echoed: printable ASCII only, at most 64 characters. */
static const char *shown(const char *value)
{
	static char buf[72];
	size_t i;

	for (i = 0; value[i] != '\0' && i < 64; i++)
		buf[i] = (value[i] >= 0x20 && value[i] < 0x7f) ? value[i] : '?';
	buf[i] = '\0';
	if (value[i] != '\0')
		strcat(buf, "...");
	return buf;
}

static int all_digits(const char *s)
{
	if (*s == '\0')
		return 0;
	for (; *s; s++)
		if (!isdigit((unsigned char)*s))
			return 0;
	return 1;
}

/* Digits with an optional fraction ("1", "1.25"); no sign, exponent, inf or nan. */
static int parse_decimal(const char *s, double *out)
{
	const char *p = s;
	char *end;
	size_t len = strlen(s);

	if (len == 0 || len > 16 || !isdigit((unsigned char)*p))
		return -1;
	while (isdigit((unsigned char)*p))
		p++;
	if (*p == '.') {
		p++;
		if (!isdigit((unsigned char)*p))
			return -1;
		while (isdigit((unsigned char)*p))
			p++;
	}
	if (*p != '\0')
		return -1;
	errno = 0;
	*out = strtod(s, &end);
	return (errno != 0 || *end != '\0') ? -1 : 0;
}

/* An integer lo..hi written in at most 10 plain digits. */
static int parse_int(const char *s, long lo, long hi, long *out)
{
	long v;

	if (!all_digits(s) || strlen(s) > 10)
		return -1;
	v = strtol(s, NULL, 10);
	if (v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

/* A GPU type as Slurm's GRES names it: a letter, then up to 63 of [A-Za-z0-9_.-]. */
static int gpu_type_ok(const char *s, size_t len)
{
	size_t i;

	if (len == 0 || len > GPU_TYPE_MAX || !isalpha((unsigned char)s[0]))
		return 0;
	for (i = 1; i < len; i++)
		if (!isalnum((unsigned char)s[i]) && s[i] != '_' && s[i] != '.' && s[i] != '-')
			return 0;
	return 1;
}

/* --rl-gpus=[TYPE:]N, as Slurm's --gpus=[type:]N. */
static int opt_gpus(int val, const char *arg, int remote)
{
	const char *colon = strrchr(arg, ':');
	const char *count = colon ? colon + 1 : arg;

	(void)val; (void)remote;
	if (parse_int(count, 1, GPUS_MAX, &gpus) < 0 ||
	    (colon && !gpu_type_ok(arg, (size_t)(colon - arg)))) {
		gpus = 0;
		slurm_error("slurmrl: --rl-gpus=%s: expected N or TYPE:N (N an integer 1..1024, "
			    "TYPE a GPU type: a letter, then up to 63 of [A-Za-z0-9_.-]), e.g. 8 "
			    "or h100:8", shown(arg));
		return -1;
	}
	gpu_type[0] = '\0';
	if (colon) {
		memcpy(gpu_type, arg, (size_t)(colon - arg));
		gpu_type[colon - arg] = '\0';
	}
	return 0;
}

static int model_ok(const char *s)
{
	const char *p;
	size_t len = strlen(s);

	if (len == 0 || len > MODEL_MAX)
		return 0;
	if (strcmp(s, "..") == 0 || strncmp(s, "../", 3) == 0 || strstr(s, "/../") ||
	    (len >= 3 && strcmp(s + len - 3, "/..") == 0))
		return 0;
	if (s[0] == '/') {
		for (p = s; *p; p++)
			if (*p <= 0x20 || *p >= 0x7f || strchr(";|&$`'\"<>\\", *p))
				return 0;
		return 1;
	}
	if (!isalnum((unsigned char)s[0]))
		return 0;
	for (p = s; *p; p++)
		if (!(isalnum((unsigned char)*p) || strchr("._:/-", *p)))
			return 0;
	return 1;
}

static int opt_model(int val, const char *arg, int remote)
{
	(void)val; (void)remote;
	if (!model_ok(arg)) {
		slurm_error("slurmrl: --rl-model=%s: expected a model name of [A-Za-z0-9._:/-] "
			    "starting with a letter or digit, or an absolute path; at most 255 "
			    "characters, no whitespace, none of ;|&$`'\"<>\\ and no '..'",
			    shown(arg));
		return -1;
	}
	snprintf(model, sizeof(model), "%s", arg);
	return 0;
}

static int opt_mem(int val, const char *arg, int remote)
{
	char digits[24];
	size_t len = strlen(arg);
	unsigned long long n, shift = 20; /* default unit: M, like Slurm's --mem */
	char unit;

	(void)val; (void)remote;
	if (len == 0 || len > 20)
		goto bad;
	unit = arg[len - 1];
	if (strchr("KkMmGgTt", unit) && len > 1) {
		shift = strchr("Kk", unit) ? 10 : strchr("Mm", unit) ? 20 :
			strchr("Gg", unit) ? 30 : 40;
		len--;
	}
	memcpy(digits, arg, len);
	digits[len] = '\0';
	if (!all_digits(digits) || len > 16)
		goto bad;
	n = strtoull(digits, NULL, 10);
	if (n == 0 || n > (MEM_MAX_BYTES >> shift))
		goto bad;
	mem_bytes = n << shift;
	return 0;
bad:
	slurm_error("slurmrl: --rl-mem=%s: expected a positive size with an optional K, M, G "
		    "or T suffix (binary units, default M), at most 1024T", shown(arg));
	return -1;
}

static int opt_mux(int val, const char *arg, int remote)
{
	(void)val; (void)remote;
	if (strcmp(arg, "auto") && strcmp(arg, "on") && strcmp(arg, "off")) {
		slurm_error("slurmrl: --rl-mux=%s: expected auto, on or off", shown(arg));
		return -1;
	}
	snprintf(mux, sizeof(mux), "%s", arg);
	return 0;
}

static int opt_group(int val, const char *arg, int remote)
{
	const char *p;
	size_t len = strlen(arg);
	int ok = len >= 1 && len <= GROUP_MAX;

	(void)val; (void)remote;
	for (p = arg; ok && *p; p++)
		ok = isalnum((unsigned char)*p) || strchr("_.-", *p) != NULL;
	if (!ok) {
		slurm_error("slurmrl: --rl-group=%s: expected 1..64 characters of [A-Za-z0-9_.-]",
			    shown(arg));
		return -1;
	}
	snprintf(group, sizeof(group), "%s", arg);
	return 0;
}

static int opt_slowdown(int val, const char *arg, int remote)
{
	double x;

	(void)val; (void)remote;
	if (parse_decimal(arg, &x) < 0 || x < 1.0 || x > 100.0) {
		slurm_error("slurmrl: --rl-max-slowdown=%s: expected a decimal number 1.0..100",
			    shown(arg));
		return -1;
	}
	snprintf(slowdown, sizeof(slowdown), "%s", arg);
	return 0;
}

/* Checks a profile; on error writes the reason into `why`. */
static int profile_ok(const char *arg, char *why, size_t whylen)
{
	char buf[PROFILE_MAX + 1], *item, *save = NULL;
	int seen[N_PHASES] = { 0 }, nphases = 0, step_seen = 0;
	double total = 0.0, x;
	size_t i;

	if (*arg == '\0' || strlen(arg) > PROFILE_MAX) {
		snprintf(why, whylen, "empty or longer than %d characters", PROFILE_MAX);
		return 0;
	}
	snprintf(buf, sizeof(buf), "%s", arg);
	if (buf[0] == ',' || buf[strlen(buf) - 1] == ',' || strstr(buf, ",,")) {
		snprintf(why, whylen, "empty item");
		return 0;
	}
	for (item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(item, '=');

		if (eq == NULL || eq == item) {
			snprintf(why, whylen, "item '%s' is not KEY=VALUE", shown(item));
			return 0;
		}
		*eq = '\0';
		if (strcmp(item, "step") == 0) {
			if (step_seen++ || parse_decimal(eq + 1, &x) < 0 || x <= 0.0 ||
			    x > STEP_MAX_S) {
				snprintf(why, whylen, "step must be given once, as seconds in (0,%g]",
					 STEP_MAX_S);
				return 0;
			}
			continue;
		}
		for (i = 0; i < N_PHASES && strcmp(item, phase_names[i]); i++)
			;
		if (i == N_PHASES) {
			snprintf(why, whylen, "unknown phase '%s'", shown(item));
			return 0;
		}
		if (seen[i]++) {
			snprintf(why, whylen, "phase '%s' given twice", phase_names[i]);
			return 0;
		}
		if (parse_decimal(eq + 1, &x) < 0 || x <= 0.0 || x > 1.0) {
			snprintf(why, whylen, "share of '%s' is not a decimal in (0,1]",
				 phase_names[i]);
			return 0;
		}
		total += x;
		nphases++;
	}
	if (nphases == 0) {
		snprintf(why, whylen, "no phase share");
		return 0;
	}
	if (total < 0.99 || total > 1.01) {
		snprintf(why, whylen, "shares sum to %.3f, not 1", total);
		return 0;
	}
	return 1;
}

static int opt_profile(int val, const char *arg, int remote)
{
	char why[160];

	(void)val; (void)remote;
	if (!profile_ok(arg, why, sizeof(why))) {
		slurm_error("slurmrl: --rl-profile=%s: %s; expected PHASE=SHARE[,...][,step=SECONDS]"
			    " with PHASE in rollout|train|sync|reward|idle (each once) and SHARE in "
			    "(0,1] summing to 1", shown(arg), why);
		return -1;
	}
	snprintf(profile, sizeof(profile), "%s", arg);
	return 0;
}

static int opt_layout(int val, const char *arg, int remote)
{
	const char *colon;

	(void)val; (void)remote;
	layout_r_given = 0;
	rollout_gpus = 0;
	if (strcmp(arg, "colocated") == 0 || strcmp(arg, "disaggregated") == 0) {
		snprintf(layout, sizeof(layout), "%s", arg);
		return 0;
	}
	colon = strchr(arg, ':');
	if (colon && (size_t)(colon - arg) == strlen("disaggregated") &&
	    strncmp(arg, "disaggregated", strlen("disaggregated")) == 0 &&
	    parse_int(colon + 1, 1, GPUS_MAX - 1, &rollout_gpus) == 0) {
		snprintf(layout, sizeof(layout), "disaggregated");
		layout_r_given = 1;
		return 0;
	}
	slurm_error("slurmrl: --rl-layout=%s: expected colocated or disaggregated[:R] with R "
		    "rollout GPUs, 1 <= R < --rl-gpus", shown(arg));
	return -1;
}

static int opt_steps(int val, const char *arg, int remote)
{
	(void)val; (void)remote;
	if (parse_int(arg, 1, STEPS_MAX, &steps) < 0) {
		slurm_error("slurmrl: --rl-steps=%s: expected a whole number 1..10000000",
			    shown(arg));
		return -1;
	}
	return 0;
}

static struct spank_option options[] = {
	{ "rl-gpus", "[TYPE:]N", "slurmrl: GPUs of this RL job (1..1024), of GPU type TYPE if "
	  "given; makes the job an RL job", 1, OPT_GPUS, opt_gpus },
	{ "rl-model", "NAME|PATH", "slurmrl: model name or absolute path", 1, OPT_MODEL,
	  opt_model },
	{ "rl-mem", "SIZE", "slurmrl: GPU memory per GPU the job's resident models need "
	  "(K|M|G|T, default M)", 1, OPT_MEM, opt_mem },
	{ "rl-mux", "auto|on|off", "slurmrl: share GPUs with other RL jobs (default auto)",
	  1, OPT_MUX, opt_mux },
	{ "rl-group", "NAME", "slurmrl: share GPUs only with jobs of the same group name", 1,
	  OPT_GROUP, opt_group },
	{ "rl-max-slowdown", "X", "slurmrl: slowdown accepted for sharing (1.0..100)", 1,
	  OPT_SLOWDOWN, opt_slowdown },
	{ "rl-profile", "SPEC", "slurmrl: prior phase shares, e.g. rollout=0.5,train=0.3,"
	  "reward=0.2[,step=SECONDS]", 1, OPT_PROFILE, opt_profile },
	{ "rl-layout", "colocated|disaggregated[:R]", "slurmrl: GPU layout (default colocated)",
	  1, OPT_LAYOUT, opt_layout },
	{ "rl-steps", "N", "slurmrl: training steps the job will run (1..10000000)", 1,
	  OPT_STEPS, opt_steps },
	SPANK_OPTIONS_TABLE_END
};

static int in_set(char c, const char *set)
{
	return c != '\0' && strchr(set, c) != NULL;
}

/*
 * The controller URL rule of slurmrl/client/rpc.py (split_url), which every job's driver
 * applies: http://HOST[:PORT][/], HOST a name or IPv4 address of [A-Za-z0-9._-] or a
 * bracketed IPv6 address of [0-9A-Fa-f:.], PORT 1..65535 in at most 5 digits.
 */
static int url_ok(const char *url)
{
	static const char host_chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
					 "0123456789._-";
	const char *p = url + 7, *start;
	long port;

	if (strlen(url) > URL_MAX || strncmp(url, "http://", 7) != 0)
		return 0;
	if (*p == '[') {
		for (start = ++p; in_set(*p, "0123456789abcdefABCDEF:."); p++)
			;
		if (p == start || *p++ != ']')
			return 0;
	} else {
		for (start = p; in_set(*p, host_chars); p++)
			;
		if (p == start)
			return 0;
	}
	if (*p == ':') {
		for (start = ++p; in_set(*p, "0123456789"); p++)
			;
		if (p == start || p - start > 5)
			return 0;
		port = strtol(start, NULL, 10);
		if (port < 1 || port > 65535)
			return 0;
	}
	if (*p == '/')
		p++;
	return *p == '\0';
}

static int parse_plugin_args(int ac, char **av)
{
	int i;

	for (i = 0; i < ac; i++) {
		if (strncmp(av[i], "controller=", 11) == 0) {
			const char *url = av[i] + 11;

			if (!url_ok(url)) {
				slurm_error("slurmrl: plugstack.conf: controller=%s: expected "
					    "http://HOST[:PORT] (HOST a name, IPv4 or [IPv6] "
					    "address; PORT 1..65535; no https, user or path)",
					    shown(url));
				return -1;
			}
			snprintf(controller, sizeof(controller), "%s", url);
		} else if (strcmp(av[i], "debug=yes") == 0) {
			debug = 1;
		} else if (strcmp(av[i], "debug=no") == 0) {
			debug = 0;
		} else {
			slurm_error("slurmrl: plugstack.conf: unknown argument '%s' (known: "
				    "controller=URL, debug=yes|no)", shown(av[i]));
			return -1;
		}
	}
	return 0;
}

/*
 * sbatch and salloc pass the options they were given to the job through its
 * environment (SLURM_SPANK__SLURM_SPANK_OPTION_slurmrl_rl_gpus=2 and
 * _SLURM_SPANK_OPTION_slurmrl_rl_gpus=2), and read such variables back as options, above
 * the script's #SBATCH lines. A job submitted from inside an RL job would so take that
 * job's directives for its own: a new allocation forgets them before they are read (an
 * srun inside the job, a step of it, keeps them).
 */
static const char *const option_prefixes[] = {
	"SLURM_SPANK__SLURM_SPANK_OPTION_slurmrl_", "_SLURM_SPANK_OPTION_slurmrl_", NULL
};

/* The variable through which option `name` travels, with prefix `prefix`. */
static void option_var(char *var, size_t size, const char *prefix, const char *name)
{
	char *q;

	snprintf(var, size, "%s%s", prefix, name);
	for (q = var + strlen(prefix); *q; q++)
		if (*q == '-')
			*q = '_';
}

/* The variables an RL job's directives reach its batch script and steps by. */
static const char *const contract_vars[] = {
	"SLURMRL_GPUS", "SLURMRL_GPU_TYPE", "SLURMRL_MUX", "SLURMRL_LAYOUT", "SLURMRL_ROLLOUT_GPUS", "SLURMRL_MODEL",
	"SLURMRL_MEM", "SLURMRL_GROUP", "SLURMRL_MAX_SLOWDOWN", "SLURMRL_PROFILE",
	"SLURMRL_STEPS", "SLURMRL_CONTROLLER", NULL
};

/* Unsets `var` in the step's environment (remote) or in this process's (allocator). */
static int forget(spank_t sp, int remote, const char *var)
{
	spank_err_t rc;

	if (!remote) {
		unsetenv(var);
		return 0;
	}
	rc = spank_unsetenv(sp, var);
	if (rc != ESPANK_SUCCESS && rc != ESPANK_ENV_NOEXIST) {
		slurm_error("slurmrl: cannot unset %s: %s", var, spank_strerror(rc));
		return -1;
	}
	return 0;
}

/*
 * Besides the options' copies, a job submitted from inside an RL job inherits its
 * SLURMRL_* variables and the SLURM_SPANK_SLURMRL_* copies of its job control env (which
 * sbatch and salloc set in their environment). sbatch and salloc forget them all (an RL
 * job gets its own back), and so does each step of a job that is no RL job: its driver's
 * connect() says it is no RL job rather than registering its parent's request.
 * SLURMRL_CONTROLLER stays: only the site's controller URL, which a user may set for
 * `slurmrl status` in any job (an RL job's own is the plugin's, `unset_stale`).
 */
static int forget_inherited(spank_t sp, int remote)
{
	char var[128];
	int i, p;

	for (i = 0; options[i].name != NULL; i++) {
		for (p = 0; option_prefixes[p] != NULL; p++) {
			option_var(var, sizeof(var), option_prefixes[p], options[i].name);
			if (forget(sp, remote, var) < 0)
				return -1;
		}
	}
	for (i = 0; contract_vars[i] != NULL; i++) {
		snprintf(var, sizeof(var), "SLURM_SPANK_%s", contract_vars[i]);
		if (forget(sp, remote, var) < 0)
			return -1;
		if (strcmp(contract_vars[i], "SLURMRL_CONTROLLER") != 0 &&
		    forget(sp, remote, contract_vars[i]) < 0)
			return -1;
	}
	return 0;
}

/*
 * `sbatch --export=NONE` (or a list of names) keeps only SLURM* variables of the
 * submitting environment: the options' _SLURM_SPANK_OPTION_* copies, from which
 * slurmstepd hands them to this plugin, are gone, and the job would not be an RL job;
 * their SLURM_SPANK__SLURM_SPANK_OPTION_* copies stay. Read the options from those.
 */
static int options_from_job_env(spank_t sp)
{
	char var[128], val[4096];
	int i;
	spank_err_t rc;

	for (i = 0; options[i].name != NULL; i++) {
		option_var(var, sizeof(var), option_prefixes[0], options[i].name);
		rc = spank_getenv(sp, var, val, sizeof(val));
		if (rc == ESPANK_ENV_NOEXIST)
			continue;
		if (rc != ESPANK_SUCCESS) {
			slurm_error("slurmrl: cannot read %s: %s", var, spank_strerror(rc));
			return -1;
		}
		if (options[i].cb(options[i].val, val, 1) < 0)
			return -1;
	}
	return 0;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	spank_context_t ctx = spank_context();
	int i;
	spank_err_t rc;

	if (ctx != S_CTX_ALLOCATOR && ctx != S_CTX_LOCAL && ctx != S_CTX_REMOTE)
		return 0;
	if (parse_plugin_args(ac, av) < 0)
		return -1;
	if (ctx == S_CTX_ALLOCATOR)
		forget_inherited(sp, 0);
	for (i = 0; options[i].name != NULL; i++) {
		rc = spank_option_register(sp, &options[i]);
		if (rc != ESPANK_SUCCESS) {
			slurm_error("slurmrl: cannot register --%s: %s", options[i].name,
				    spank_strerror(rc));
			return -1;
		}
	}
	return 0;
}

static int any_rl_option(const char **which)
{
	*which = model[0] ? "--rl-model" : mem_bytes ? "--rl-mem" : mux[0] ? "--rl-mux" :
		 group[0] ? "--rl-group" : slowdown[0] ? "--rl-max-slowdown" :
		 profile[0] ? "--rl-profile" : layout[0] ? "--rl-layout" :
		 steps ? "--rl-steps" : NULL;
	return *which != NULL;
}

static int cross_check(void)
{
	const char *which;

	if (gpus == 0) {
		if (any_rl_option(&which)) {
			slurm_error("slurmrl: %s given without --rl-gpus: an RL job needs "
				    "--rl-gpus=N", which);
			return -1;
		}
		return 0;
	}
	if (strcmp(layout, "disaggregated") == 0) {
		if (gpus < 2) {
			slurm_error("slurmrl: --rl-layout=disaggregated needs --rl-gpus of at "
				    "least 2 (got %ld)", gpus);
			return -1;
		}
		if (!layout_r_given)
			rollout_gpus = gpus / 2;
		if (rollout_gpus >= gpus) {
			slurm_error("slurmrl: --rl-layout=disaggregated:%ld: expected 1 <= R < "
				    "--rl-gpus=%ld", rollout_gpus, gpus);
			return -1;
		}
	}
	return 0;
}

typedef spank_err_t (*setenv_f)(spank_t, const char *, const char *, int);

struct env_var { const char *name; const char *value; };

/*
 * A job submitted from inside another RL job inherits its SLURMRL_* variables through
 * sbatch's environment; in an RL step only the variables this job's options set may stay,
 * and the user's SLURMRL_CONTROLLER where plugstack.conf names no controller.
 */
static int unset_stale(spank_t sp, const struct env_var *vars, int n)
{
	int i, j, keep;
	spank_err_t rc;

	for (i = 0; contract_vars[i] != NULL; i++) {
		keep = !controller[0] && strcmp(contract_vars[i], "SLURMRL_CONTROLLER") == 0;
		for (j = 0; j < n && !keep; j++)
			keep = strcmp(vars[j].name, contract_vars[i]) == 0;
		if (keep)
			continue;
		rc = spank_unsetenv(sp, contract_vars[i]);
		if (rc != ESPANK_SUCCESS && rc != ESPANK_ENV_NOEXIST) {
			slurm_error("slurmrl: cannot unset %s: %s", contract_vars[i],
				    spank_strerror(rc));
			return -1;
		}
	}
	return 0;
}

/* Exports the job's directives through `set`; only RL jobs (--rl-gpus) get any. */
static int export_all(spank_t sp, setenv_f set, const char *how)
{
	char num[32];
	struct env_var vars[16];
	int n = 0, i;
	char gpus_s[16], mem_s[24], steps_s[16];
	spank_err_t rc;

	if (gpus == 0) /* no RL job: a step keeps none of an RL parent's variables */
		return set == spank_setenv ? forget_inherited(sp, 1) : 0;
	snprintf(gpus_s, sizeof(gpus_s), "%ld", gpus);
	vars[n].name = "SLURMRL_GPUS"; vars[n++].value = gpus_s;
	if (gpu_type[0]) { vars[n].name = "SLURMRL_GPU_TYPE"; vars[n++].value = gpu_type; }
	vars[n].name = "SLURMRL_MUX"; vars[n++].value = mux[0] ? mux : "auto";
	vars[n].name = "SLURMRL_LAYOUT"; vars[n++].value = layout[0] ? layout : "colocated";
	if (strcmp(layout, "disaggregated") == 0) {
		snprintf(num, sizeof(num), "%ld", rollout_gpus);
		vars[n].name = "SLURMRL_ROLLOUT_GPUS"; vars[n++].value = num;
	}
	if (model[0]) { vars[n].name = "SLURMRL_MODEL"; vars[n++].value = model; }
	if (mem_bytes) {
		snprintf(mem_s, sizeof(mem_s), "%llu", mem_bytes);
		vars[n].name = "SLURMRL_MEM"; vars[n++].value = mem_s;
	}
	if (group[0]) { vars[n].name = "SLURMRL_GROUP"; vars[n++].value = group; }
	if (slowdown[0]) { vars[n].name = "SLURMRL_MAX_SLOWDOWN"; vars[n++].value = slowdown; }
	if (profile[0]) { vars[n].name = "SLURMRL_PROFILE"; vars[n++].value = profile; }
	if (steps) {
		snprintf(steps_s, sizeof(steps_s), "%ld", steps);
		vars[n].name = "SLURMRL_STEPS"; vars[n++].value = steps_s;
	}
	if (controller[0]) {
		vars[n].name = "SLURMRL_CONTROLLER"; vars[n++].value = controller;
	}
	if (set == spank_setenv && unset_stale(sp, vars, n) < 0)
		return -1;
	for (i = 0; i < n; i++) {
		rc = set(sp, vars[i].name, vars[i].value, 1);
		if (rc != ESPANK_SUCCESS) {
			slurm_error("slurmrl: cannot export %s (%s): %s", vars[i].name, how,
				    spank_strerror(rc));
			return -1;
		}
		if (debug)
			slurm_info("slurmrl: %s %s=%s", how, vars[i].name, vars[i].value);
	}
	return 0;
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	spank_context_t ctx = spank_context();
	const char *which;

	(void)ac; (void)av;
	if (ctx != S_CTX_ALLOCATOR && ctx != S_CTX_LOCAL && ctx != S_CTX_REMOTE)
		return 0;
	if (ctx == S_CTX_REMOTE && gpus == 0 && !any_rl_option(&which)
	    && options_from_job_env(sp) < 0)
		return -1;
	if (cross_check() < 0)
		return -1;
	if (ctx == S_CTX_REMOTE)
		return 0; /* exported in user_init, where the step's environment is final */
	return export_all(sp, spank_job_control_setenv, "job control env");
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	(void)ac; (void)av;
	if (spank_context() != S_CTX_REMOTE)
		return 0;
	return export_all(sp, spank_setenv, "step env");
}
