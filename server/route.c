/*
 * route.c - matching a path against a row of the route table, binding its "{name}" parameters,
 * and the row's allowed methods (route.h). The table itself is routes.c.
 */
#include "server/route.h"

#include <string.h>

static bool param_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-';
}

bool srv__route_match(const char *pattern, const char *path, srv_params *params)
{
    const char *p = pattern, *u = path;
    memset(params, 0, sizeof *params);
    while (*p && *u) {
        if (*p == '{') {
            const char *close = strchr(p, '}');
            size_t name_len, val_len = strcspn(u, "/");
            bool ok = val_len > 0 && val_len <= SRV_PARAM_MAX;
            if (!close || params->count >= SRV_PARAMS_MAX)
                return false; /* defensive: a malformed pattern matches nothing */
            name_len = (size_t)(close - p - 1);
            if (name_len > SRV_PARAM_NAME_MAX)
                name_len = SRV_PARAM_NAME_MAX;
            if (val_len == 0)
                return false; /* an empty segment is a different path */
            for (size_t i = 0; ok && i < val_len; i++)
                ok = param_char(u[i]);
            if (ok) {
                memcpy(params->p[params->count].name, p + 1, name_len);
                memcpy(params->p[params->count].value, u, val_len);
                params->count++;
            } else if (!params->bad[0]) {
                memcpy(params->bad, p + 1, name_len);
            }
            p = close + 1;
            u += val_len;
            continue;
        }
        if (*p != *u)
            return false;
        p++;
        u++;
    }
    return *p == '\0' && *u == '\0';
}

bool srv__route_allows(const srv_route_def *rd, const char *method)
{
    size_t n = strlen(method);
    const char *a = rd->allow;
    while (n > 0 && *a) {
        size_t len = strcspn(a, ", ");
        if (len == n && strncmp(a, method, n) == 0)
            return true;
        a += len;
        a += strspn(a, ", ");
    }
    return false;
}

const char *srv__param(const srv_params *params, const char *name)
{
    for (int i = 0; i < params->count; i++) {
        if (strcmp(params->p[i].name, name) == 0)
            return params->p[i].value;
    }
    return NULL;
}
