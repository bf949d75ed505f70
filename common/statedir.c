#include "statedir.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void state_dir_resolve(char *out, size_t len, const char *explicit_dir)
{
	const char *env = getenv("PODEMU_STATE_DIR");
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	if (explicit_dir != NULL && explicit_dir[0] != '\0')
		snprintf(out, len, "%s", explicit_dir);
	else if (env != NULL && env[0] != '\0')
		snprintf(out, len, "%s", env);
	else if (xdg != NULL && xdg[0] != '\0')
		snprintf(out, len, "%s/podemu", xdg);
	else
		snprintf(out, len, "/tmp/podemu-%u", (unsigned)getuid());
}

void state_coordinator_url(char *out, size_t len, const char *state_dir)
{
	const char *env = getenv("PODEMU_COORDINATOR");
	if (env != NULL && env[0] != '\0') {
		snprintf(out, len, "%s", env);
		return;
	}
	char dir[4096], path[4200];
	state_dir_resolve(dir, sizeof(dir), state_dir);
	snprintf(path, sizeof(path), "%s/%s", dir, STATE_COORDINATOR_FILE);
	FILE *f = fopen(path, "r");
	if (f != NULL) {
		char line[512];
		if (fgets(line, sizeof(line), f) != NULL) {
			line[strcspn(line, "\r\n")] = '\0';
			if (line[0] != '\0') {
				snprintf(out, len, "%s", line);
				fclose(f);
				return;
			}
		}
		fclose(f);
	}
	snprintf(out, len, "tcp://127.0.0.1:7460");
}

void state_token(char *out, size_t len, const char *state_dir)
{
	const char *env = getenv("PODEMU_TOKEN");
	out[0] = '\0';
	if (env != NULL) {
		snprintf(out, len, "%s", env);
		return;
	}
	char dir[4096], path[4200];
	state_dir_resolve(dir, sizeof(dir), state_dir);
	snprintf(path, sizeof(path), "%s/token", dir);
	FILE *f = fopen(path, "r");
	if (f == NULL)
		return;
	if (fgets(out, (int)len, f) == NULL)
		out[0] = '\0';
	out[strcspn(out, "\r\n")] = '\0';
	fclose(f);
}
